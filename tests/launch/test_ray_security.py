"""A local Ray started by the launcher listens on 127.0.0.1 only (unless
launcher.ray.expose=true)."""

import subprocess
import sys
import textwrap

import pytest

# Starts a local Ray through the launcher, then lists every listening TCP socket owned by a
# descendant of this process (Ray's GCS, raylet, workers), read from `ss` and /proc.
PROBE = textwrap.dedent("""
    import os, re, subprocess, sys
    from vapo_lab.launch.ray import ray_init
    import ray
    ray_init({"cluster_cpus": 1, "expose": sys.argv[1] == "expose"})
    ray.get(ray.remote(lambda: 1).remote())  # a worker is up too

    def ancestors(pid):
        while pid > 1:
            yield pid
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])

    me = os.getpid()
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        local = line.split()[3]
        for pid in map(int, re.findall(r"pid=(\\d+)", line)):
            try:
                if me in ancestors(pid) or pid == me:
                    print("LISTEN", local)
            except OSError:
                pass
    ray.shutdown()
""")


def _listening(mode):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [line.split()[1] for line in out.stdout.splitlines() if line.startswith("LISTEN")]


@pytest.mark.slow
def test_a_local_ray_listens_on_loopback_only():
    addresses = _listening("default")
    assert len(addresses) >= 3  # GCS, raylet, a worker at least
    hosts = {a.rsplit(":", 1)[0] for a in addresses}
    assert hosts <= {"127.0.0.1", "[::ffff:127.0.0.1]"}, addresses


@pytest.mark.slow
def test_expose_listens_beyond_loopback():
    hosts = {a.rsplit(":", 1)[0] for a in _listening("expose")}
    assert hosts - {"127.0.0.1", "[::ffff:127.0.0.1]"}, hosts
