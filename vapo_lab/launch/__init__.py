"""Grids of runs and where they run: local processes, Ray, or Slurm through submitit.

``grid`` turns a grid file into cells (config-hashed runs, each composed once); ``cell`` is the
body of every job (prepare the shared caches; run, resume or skip one cell). ``base`` says what a
launcher is (the ``Launcher`` protocol), ``registry`` lists them (``local``, ``ray``, ``slurm``: one
module each) and ``submit`` hands a grid to one of them, the same way for all. A grid's folder
(``record``), its cells' status files (``status``) and whether a cell still runs (``liveness``)
serve ``jobs`` (``vapo-lab jobs`` / ``cancel``). ``commands`` is what the CLI calls.
"""
