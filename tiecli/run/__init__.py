# Used by every command that touches a run directory: `train` writes one, the others read it.
"""A run directory describes itself; this package owns its format. Nothing else opens its files.

runs/<name>/
  config.yaml      the resolved config the run was trained with
  overrides.yaml   the command-line overrides and the group choices they selected
  metrics.jsonl    a format header line, then one JSON object per logged step
  summary.json     status (running/completed/failed/interrupted), parameter counts, final metrics, versions
  eval.json        full-split evaluations by split, from `tiecli train` and `tiecli eval`
  geometry.json    geometry of the token matrices, one entry per measured step
  trackers.json    with logger=[wandb]: the W&B run id, so a resumed run continues the same W&B run
  tb/, wandb/      with logger=[...]: what TensorBoard and W&B write (see tiecli/train/trackers.py)
  checkpoints/     last.pt (model, optimizer, RNG and data position), init.pt (token matrices at
                   step 0), emb/step_N.pt (token matrices at each geometry step), and with
                   train.keep_checkpoints, step_N.pt (earlier last.pt files, for sample/eval --step N)
  .lock            held (flock) by the one process writing the run; the OS releases it when that process dies
  .undo/           while --resume extends a completed run: hard links to its files as they were (RunWriter.undo)

Every JSON file carries `format` (FORMAT); a reader refuses a newer one by name. Every file is
written to a temporary name in the same folder and renamed into place, so a crash leaves either
the old file or the new one; metrics.jsonl is appended a whole line at a time and a torn last line
is ignored. A new run directory is built in a temporary folder and renamed into place, so it
either exists whole (config, overrides, summary, init checkpoint) or not at all.

`RunWriter` is the only code that writes a run, `RunReader` the only code that reads one. By job:

  layout.py   the files' names (above), FORMAT, run ids, where a named run lives
  files.py    atomic writes, JSON and YAML reading, the lock, timestamps
  records.py  the records (Summary, MetricsRow, EvalResult, GeometryEntry, the sweep manifest) and
              their typed validation
  reader.py   RunReader
  writer.py   RunWriter, which hands each record it writes to the listeners its caller attaches
              (tiecli/train/trackers.py feeds TensorBoard and W&B that way)

Storage imports nothing from tiecli but tiecli.errors: configs, trackers and sweeps sit above it.
"""
