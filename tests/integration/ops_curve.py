"""ops_curve.py - the admin endpoint with its own CURVE key: ecsctl keygen
makes the pairs (.key mode 0600, never overwritten); a coordinator with
--admin-key and --admin-clients answers a client whose key is listed,
refuses (and logs) a client with another key and a plaintext one.
Standard library only. usage: ops_curve.py ROOT BUILD"""
import os
import shutil
import stat
import subprocess
import sys
import tempfile

from ops_lib import check, finish
from serve_lib import Server, free_port, model_path

root, build = sys.argv[1], sys.argv[2]
binary = os.path.join(root, build, "bin", "ecs-coordinator")
ecsctl = os.path.join(root, build, "bin", "ecsctl")
model = model_path(root, build, "tiny-ds2-q8_0")
tmp = tempfile.mkdtemp(prefix="ecs-curve-")


def run(*args):
    p = subprocess.run([ecsctl] + list(args), capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


srv = None
try:
    os.mkdir(os.path.join(tmp, "clients"))
    for name in ("server", "clients/ops", "intruder"):
        rc, out, err = run("keygen", os.path.join(tmp, name))
        check(rc == 0, "keygen %s: %s" % (name, (out + err).strip()))
    mode = stat.S_IMODE(os.stat(os.path.join(tmp, "server.key")).st_mode)
    check(mode == 0o600, "the .key file is mode %o" % mode)
    rc, out, err = run("keygen", os.path.join(tmp, "server"))
    check(rc == 1 and err.strip(), "keygen refuses to overwrite: %s" % err.strip())
    ep = "tcp://127.0.0.1:%d" % free_port()
    srv = Server(binary, model, "--admin", ep, "--admin-key", os.path.join(tmp, "server.key"),
                 "--admin-clients", os.path.join(tmp, "clients"))
    spub = os.path.join(tmp, "server.pub")
    rc, out, err = run("--admin", ep, "--key", os.path.join(tmp, "clients/ops.key"),
                       "--server-key", spub, "status")
    check(rc == 0 and "experts: local" in out, "a listed client key gets its answer")
    rc, out, err = run("--admin", ep, "--key", os.path.join(tmp, "intruder.key"),
                       "--server-key", spub, "--timeout", "2", "status")
    check(rc == 1 and "no answer" in err, "an unlisted key gets nothing")
    rc, out, err = run("--admin", ep, "--timeout", "2", "status")
    check(rc == 1 and "no answer" in err, "a plaintext client gets nothing")
    check("admin: refused a client" in srv.read_log(), "the refusal is logged")
    srv_rc = srv.stop()
    srv = None
    check(srv_rc == 0, "coordinator exit status %d" % srv_rc)
    p = subprocess.run([binary, "-m", model, "--admin", ep, "--admin-key", spub, "--http",
                        "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    check(p.returncode != 0 and "--admin-clients" in p.stderr,
          "--admin-key without --admin-clients is refused: %s" % p.stderr.strip()[-120:])
finally:
    if srv:
        srv.stop()
    shutil.rmtree(tmp, ignore_errors=True)
finish()
