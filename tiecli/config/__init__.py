"""tiecli's config: conf/*.yaml composed by Hydra, checked against dataclasses, handed on as a `Config`.

schema    the dataclasses: each key's type (conf/ holds every default), the launcher's too
compose   conf/ plus overrides into a DictConfig (Hydra), a stored run's config recomposed, a launcher's file
checks    validation: the schema's keys and types (OmegaConf), then each value; to_config
messages  OmegaConf's refusals reworded into one line naming the key, its value and what is valid
naming    a run's default name, and the check of a name given with --name
"""
