# pytest tests/test_batches.py   (CPU, a second)
import numpy as np
import pytest
import torch

from tiecli.data import batches


def test_batches_are_next_token_pairs_and_reproducible():
    tokens = np.arange(1000, dtype=np.uint16)
    x, y = batches.get_batch(tokens, 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16) and torch.equal(y, x + 1)
    x2, _ = batches.get_batch(tokens, 4, 16, torch.Generator().manual_seed(0))
    assert torch.equal(x, x2)


class Recorded(np.ndarray):
    """A token array that counts the windows read from it (as a memmap would page them in)."""

    rows = 0

    def __getitem__(self, index):
        if isinstance(index, np.ndarray) and index.ndim == 2:
            Recorded.rows += index.shape[0]
        return np.asarray(super().__getitem__(index))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_each_rank_reads_only_its_rows_and_trains_on_todays_batches(world):
    """Step after step, with the next step prefetched, rank r's micro-batches are rows [r G/N, (r+1) G/N)
    of the grad_accum x batch_size windows one process draws (how tiecli batched before), and it reads only
    those G/N windows; state() is the generator's state from before a prefetched step."""
    tokens, (B, A, T) = np.arange(5000, dtype=np.uint16), (4, 3, 16)
    one = torch.Generator().manual_seed(7)
    steps = [[batches.get_batch(tokens, B, T, one) for _ in range(A)] for _ in range(3)]  # one process's draws
    per_rank = B * A // world
    micro = max(d for d in range(1, min(per_rank, B) + 1) if per_rank % d == 0)
    for rank in range(world):
        gen = torch.Generator().manual_seed(7)
        recorded = tokens.view(Recorded)
        stream = batches.StepBatches(recorded, B, A, T, micro, rank, world, gen, torch.device("cpu"))
        Recorded.rows = 0
        for i, draws in enumerate(steps):
            expected = [torch.cat([d[k] for d in draws])[rank * per_rank : (rank + 1) * per_rank] for k in (0, 1)]
            got = stream.next()
            assert all(x.shape[0] == micro for x, _ in got) and Recorded.rows == (i + 1) * per_rank
            assert torch.equal(torch.cat([x for x, _ in got]), expected[0])
            assert torch.equal(torch.cat([y for _, y in got]), expected[1])
            before = gen.get_state()
            stream.prefetch()
            assert torch.equal(stream.state(), before) and not torch.equal(gen.get_state(), before)


def test_eval_windows_cover_every_target_once():
    for n, t in [(100, 8), (97, 8), (9, 8), (10, 8)]:
        covered = [s + 1 + i for s, length in batches.eval_windows(n, t) for i in range(length)]
        assert covered == list(range(1, n))
    limited = batches.eval_windows(1000, 8, limit=5)
    assert len(limited) == 5 and limited[0][0] == 0 and limited == batches.eval_windows(1000, 8, limit=5)
