"""Real Ray clusters for RayConnector's tests (test_ray*.py), each in
network namespaces of its own, so every Ray process is bound to the test's
namespaces and nothing else (Ray's servers listen on every address of the
namespace they run in: here a loopback, or one end of the test's veth).

Cluster(tmp, nodes=1): one network namespace with only a loopback and a
head node at 127.0.0.1. Cluster(tmp, nodes=2): two namespaces joined by a
veth pair (10.R.S.1 and 10.R.S.2), a head in the first, a worker node in the
second. Ray's ports: GCS at a port this file picks (every port of a fresh
namespace is free), the others the kernel's. Each node is one `ray start
--block` in a session of its own; stop() ends every process of those
sessions (SIGTERM, then SIGKILL), found by session id, then deletes the
namespaces: also when a test fails (a fixture's finalizer), at exit, and
on SIGTERM (the step's timeout).

Stage(cluster, node, config): a driver process in the node's namespace
(python tests/raystage.py), a RayConnector of the config, driven by JSON
lines (raystage.py says which), every call bounded in time.
"""
import atexit
import json
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
RAY_PORT = 6390
OBJECT_STORE = 150 * 1000 * 1000


def _run(*cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=30)


def _ray_bin():
    b = os.path.join(os.path.dirname(sys.executable), "ray")
    return b if os.path.exists(b) else shutil.which("ray")


def _session_pids(sid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            fields = st[st.rindex(")") + 2:].split()
            if int(fields[3]) == sid:  # field 6: session
                out.append(int(d))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _kill_session(sid, grace=1.0, signals=(signal.SIGTERM, signal.SIGKILL)):
    """End every process of session sid: each signal in turn, waiting up
    to grace seconds after each for them to be gone."""
    for sig in signals:
        pids = _session_pids(sid)
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while _session_pids(sid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not _session_pids(sid):
            return


_live = []  # clusters not stopped yet: stopped at exit, on SIGTERM too


def _stop_all():
    for c in list(_live):
        c.stop()


def _on_sigterm(signum, frame):
    _stop_all()
    raise KeyboardInterrupt  # pytest ends the session (not only the test)


atexit.register(_stop_all)


class Cluster:
    def __init__(self, nodes=1):
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
        _live.append(self)
        self.tag = uuid.uuid4().hex[:8]
        self.tmp = tempfile.mkdtemp(prefix="fr-", dir="/tmp")  # short: Ray's socket paths
        self.rt = os.path.join(self.tmp, "rt")
        os.mkdir(self.rt, 0o700)
        self.netns = []
        self.procs = []   # ray start --block, one per node
        self.stages = []
        self.ips = []
        self.veth = None
        try:
            self._start(nodes)
        except BaseException:
            self.stop()
            raise

    def _start(self, nodes):
        for i in range(nodes):
            ns = f"fr{self.tag}{i}"
            _run("ip", "netns", "add", ns)
            self.netns.append(ns)
            _run("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        if nodes == 1:
            self.ips = ["127.0.0.1"]
        else:
            a, b = f"fa{self.tag}", f"fb{self.tag}"
            r, s = random.randint(100, 250), random.randint(0, 255)
            self.ips = [f"10.{r}.{s}.1", f"10.{r}.{s}.2"]
            _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            self.veth = (a, b)
            for ns, dev, ip in ((self.netns[0], a, self.ips[0]), (self.netns[1], b, self.ips[1])):
                _run("ip", "link", "set", dev, "netns", ns)
                _run("ip", "netns", "exec", ns, "ip", "addr", "add", f"{ip}/30", "dev", dev)
                _run("ip", "netns", "exec", ns, "ip", "link", "set", dev, "up")
        self.address = f"{self.ips[0]}:{RAY_PORT}"
        for i in range(nodes):
            self._node(i)
        self._wait_nodes(nodes, 90)

    def _node(self, i):
        tmp = os.path.join(self.tmp, f"n{i}")
        os.makedirs(tmp)
        cmd = ["ip", "netns", "exec", self.netns[i], _ray_bin(), "start", "--block",
               f"--node-ip-address={self.ips[i]}", "--num-cpus=1",
               f"--object-store-memory={OBJECT_STORE}", "--disable-usage-stats",
               f"--temp-dir={tmp}", f"--resources={{\"node{i}\": 1}}"]
        if i == 0:
            cmd += ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
        else:
            cmd += [f"--address={self.address}"]
        log = open(os.path.join(self.tmp, f"node{i}.log"), "w")
        self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True, env=self.env()))

    def env(self):
        e = dict(os.environ)
        e["FERRY_RUNTIME_DIR"] = self.rt  # short: unix socket paths
        e["RAY_USAGE_STATS_ENABLED"] = "0"
        e["RAY_DEDUP_LOGS"] = "0"
        return e

    def _wait_nodes(self, n, timeout):
        code = ("import ray,sys; ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2], "
                "log_to_driver=False); print(sum(1 for x in ray.nodes() if x['Alive']))")
        deadline = time.monotonic() + timeout
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"ray start exited {p.returncode}: {self.logs()}")
            try:
                r = subprocess.run(["ip", "netns", "exec", self.netns[0], sys.executable, "-c",
                                    code, self.address, self.ips[0]], capture_output=True,
                                   text=True, timeout=40, env=self.env())
                if r.returncode == 0 and int(r.stdout.strip().splitlines()[-1]) >= n:
                    return
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{n} Ray nodes not up in {timeout}s: {self.logs()}")
            time.sleep(0.5)

    def logs(self):
        out = []
        for i in range(len(self.procs)):
            try:
                with open(os.path.join(self.tmp, f"node{i}.log")) as f:
                    out.append(f.read()[-3000:])
            except OSError:
                pass
        return "\n".join(out)

    def veth_bytes(self):
        """Bytes the head's end of the veth sent and received."""
        r = subprocess.run(["ip", "netns", "exec", self.netns[0], "cat",
                            f"/sys/class/net/{self.veth[0]}/statistics/tx_bytes",
                            f"/sys/class/net/{self.veth[0]}/statistics/rx_bytes"],
                           capture_output=True, text=True, timeout=10, check=True)
        tx, rx = (int(x) for x in r.stdout.split())
        return tx + rx

    def stage(self, node, config, **kw):
        s = Stage(self, node, config, **kw)
        self.stages.append(s)
        return s

    def stop(self):
        if self in _live:
            _live.remove(self)
        for s in self.stages:
            s.kill()
        for p in reversed(self.procs):
            _kill_session(p.pid)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
        for ns in self.netns:
            subprocess.run(["ip", "netns", "del", ns], stderr=subprocess.DEVNULL, timeout=30)
        self.netns = []
        shutil.rmtree(self.tmp, ignore_errors=True)


class StageError(AssertionError):
    pass


class Stage:
    """One driver process (tests/raystage.py) with one RayConnector."""

    def __init__(self, cluster, node, config, ray_namespace=None):
        self.cluster, self.node = cluster, node
        cfg = dict(config)
        cmd = ["ip", "netns", "exec", cluster.netns[node], sys.executable,
               os.path.join(HERE, "raystage.py"), cluster.address, cluster.ips[node],
               json.dumps(cfg)]
        self.errlog = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.errlog, text=True, env=cluster.env(),
                                     start_new_session=True)
        self.ready = self._read(90)

    def _read(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise StageError(f"stage {self.node}: no answer in {timeout}s\n{self.stderr()}")
            try:
                r, _, _ = select.select([self.proc.stdout], [], [], left)
            except InterruptedError:
                continue
            if not r:
                continue
            line = self.proc.stdout.readline()
            if not line:
                raise StageError(f"stage exited ({self.proc.poll()})\n{self.stderr()}")
            msg = json.loads(line)
            if "error" in msg:
                raise StageError(f"stage: {msg['error']}\n{self.stderr()}")
            return msg

    def stderr(self):
        try:
            self.errlog.seek(0)
            return self.errlog.read()[-6000:]
        except (OSError, ValueError):
            return ""

    def send(self, op, **kw):
        """Send a command; its answer is read by answer()."""
        kw["op"] = op
        self.proc.stdin.write(json.dumps(kw) + "\n")
        self.proc.stdin.flush()

    def answer(self, wait=60):
        return self._read(wait)

    def call(self, op, wait=60, **kw):
        self.send(op, **kw)
        return self._read(wait)

    def close(self, wait=60):
        self.call("exit", wait=wait)
        self.proc.wait(wait)

    def kill(self):
        """SIGKILL: the process dies at once, as a crash would."""
        if self.proc.poll() is None:
            _kill_session(self.proc.pid, grace=5.0, signals=(signal.SIGKILL,))
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
