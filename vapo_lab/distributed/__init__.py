"""One run on many ranks with torch's own engines.

The process group (:mod:`~vapo_lab.distributed.world`), FSDP2 sharding
(:mod:`~vapo_lab.distributed.fsdp`), torch distributed checkpoints
(:mod:`~vapo_lab.distributed.dcp`) and the training state's trips to host memory around a rollout
(:mod:`~vapo_lab.distributed.offload`); torchrun is started by :mod:`vapo_lab.launch.ranks`.
``trainer.strategy=single`` uses only :func:`~vapo_lab.distributed.world.single`.
"""
