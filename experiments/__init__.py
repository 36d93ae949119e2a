"""Grid files for `vapo-lab sweep` / `vapo-lab ablate --table1` (shipped as
vapo_lab.experiments)."""
