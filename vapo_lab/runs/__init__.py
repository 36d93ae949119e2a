"""A run's folder: its layout, its checkpoints and its metrics record.

``<output_dir>/<run name>/`` holds ``run.json`` (tracking run id, command, component choices),
``config.yaml`` (resolved), ``metrics.jsonl`` (every logged metric) and ``checkpoints/``. The
trainer writes it; evaluation, grids and resume read it through this package.
"""
