"""A real kube-apiserver + etcd on loopback, for integration tests and CI.

Why a real apiserver and not a mock: the autoscaler's contract with Kubernetes is API semantics -- the
``/scale`` subresource, CRDs with a status subresource, RBAC that lets a service account patch scale
but not delete. Only the real server proves those. No controller-manager runs, so ``status``,
ReplicaSets and Pods never change; tests assert on the API, not on reconciliation.

The binaries come from ``scripts/install-etcd.sh`` and ``scripts/install-kube-apiserver.sh`` (built
once, cached under ``${TOKENPOOLS_CACHE:-~/.cache/tokenpools}``). This module is an I/O shell: nothing
happens at import time; :class:`KubeAPIServer` starts processes only in :meth:`KubeAPIServer.start`.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from tokenpools_dev.devstack.process import cache_dir, free_ports, log_tail, spawn_logged, stop_process

DEFAULT_KUBE_VERSION = "1.34.4"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
_PORT_ATTEMPTS = 3

# Admission plugins to disable. ServiceAccount admission rejects every Pod until the (absent) token
# controller has created the namespace's `default` SA. The rest stay on: disabling 11 more saved only
# ~0.08 s of apiserver CPU to /readyz (of ~2 s, measured) and would cost fidelity.
_DISABLED_ADMISSION = ("ServiceAccount",)


class KubeStackError(RuntimeError):
    """A binary is missing, a process died, or readiness timed out (message carries the log tail)."""


def find_kube_apiserver() -> Path:
    """``$TOKENPOOLS_KUBE_APISERVER``, else the cached build of ``$KUBE_APISERVER_VERSION``."""
    if env := os.environ.get("TOKENPOOLS_KUBE_APISERVER"):
        return Path(env)
    version = os.environ.get("KUBE_APISERVER_VERSION", DEFAULT_KUBE_VERSION)
    binary = cache_dir() / "kube" / f"v{version}" / "kube-apiserver"
    if binary.is_file() and (binary.parent / ".built-ok").is_file():
        return binary
    raise KubeStackError(f"kube-apiserver not built at {binary}: run scripts/install-kube-apiserver.sh")


def find_etcd() -> Path:
    """``$TOKENPOOLS_ETCD``, else the etcd scripts/install-etcd.sh selected, else ``etcd`` on PATH."""
    if env := os.environ.get("TOKENPOOLS_ETCD"):
        return Path(env)
    selected = cache_dir() / "etcd" / "selected"
    if selected.is_file() and Path(chosen := selected.read_text().strip()).is_file():
        return Path(chosen)
    if system := shutil.which("etcd"):
        return Path(system)
    raise KubeStackError("etcd not found: run scripts/install-etcd.sh")


def kubeconfig_dict(server: str, user: str, token: str, namespace: str = "default") -> dict[str, Any]:
    """A one-context kubeconfig using a bearer token; TLS unverified (self-signed serving cert)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "local", "user": user, "namespace": namespace}}],
        "current-context": user,
    }


def _stop_all(procs: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """Finalizer target: must not reference the owning object (weakref.finalize)."""
    for proc in procs:
        stop_process(proc, timeout)


class KubeAPIServer:
    """etcd + kube-apiserver on free loopback ports, with an admin token and service-account tokens.

    Use as a context manager (or call :meth:`start`/:meth:`stop`). After start: :attr:`server_url`,
    :attr:`admin_token`, :attr:`kubeconfig_path` (admin, group ``system:masters``), and
    :meth:`write_service_account_kubeconfig` for clients that must run under RBAC. State lives in a
    temp dir (on /dev/shm when writable) removed by :meth:`stop`; set ``TOKENPOOLS_KEEP_KUBE_DIR=1`` to
    keep it (logs: ``etcd.log``, ``kube-apiserver.log``) when debugging.
    """

    def __init__(
        self,
        *,
        kube_apiserver: Path | None = None,
        etcd: Path | None = None,
        base_dir: Path | None = None,
        ready_timeout: float = 90.0,
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self._kube_bin = kube_apiserver
        self._etcd_bin = etcd
        self._base_dir = base_dir
        self._ready_timeout = ready_timeout
        self._extra_args = extra_args
        self._dir: Path | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._server_url: str | None = None
        self._admin_token = secrets.token_urlsafe(24)
        self.startup_seconds: float | None = None
        """Wall time of :meth:`start` (etcd + apiserver until /readyz), for the record."""

    # -- public properties ------------------------------------------------------------------------
    @property
    def server_url(self) -> str:
        if self._server_url is None:
            raise KubeStackError("KubeAPIServer not started")
        return self._server_url

    @property
    def admin_token(self) -> str:
        return self._admin_token

    @property
    def work_dir(self) -> Path:
        if self._dir is None:
            raise KubeStackError("KubeAPIServer not started")
        return self._dir

    @property
    def kubeconfig_path(self) -> Path:
        return self.work_dir / "admin.kubeconfig"

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Self:
        """Start etcd, then kube-apiserver; block until /readyz is ok and the admin kubeconfig exists."""
        if self._procs:
            raise KubeStackError("KubeAPIServer already started")
        t0 = time.monotonic()
        kube_bin = self._kube_bin or find_kube_apiserver()
        etcd_bin = self._etcd_bin or find_etcd()
        self._dir = Path(tempfile.mkdtemp(prefix="tokenpools-kube-", dir=self._base_dir or _fast_tmp()))
        self._finalizer = weakref.finalize(self, _stop_all, self._procs, 5.0)
        try:
            for attempt in range(_PORT_ATTEMPTS):
                try:
                    etcd_url = self._start_etcd(etcd_bin)
                    self._start_apiserver(kube_bin, etcd_url)
                    break
                except KubeStackError as exc:
                    # Ports are picked before the servers bind them; someone else may win the race.
                    if "address already in use" not in str(exc) or attempt == _PORT_ATTEMPTS - 1:
                        raise
                    self._reset_attempt()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Terminate apiserver then etcd (SIGTERM, SIGKILL after 10 s) and remove the temp dir."""
        for proc in reversed(self._procs):
            stop_process(proc, 10.0)
        self._procs.clear()
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if self._dir is not None and not os.environ.get("TOKENPOOLS_KEEP_KUBE_DIR"):
            shutil.rmtree(self._dir, ignore_errors=True)
        self._server_url = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- service accounts -------------------------------------------------------------------------
    async def mint_service_account_token(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600
    ) -> str:
        """A bound token for an existing ServiceAccount via the TokenRequest API (as kubelet would)."""
        from kubernetes_asyncio import client, config  # lazy: keep `import tokenpools_dev.devstack.kube` cheap

        api = await config.new_client_from_config(config_file=str(self.kubeconfig_path), persist_config=False)
        async with api:
            body = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[SA_ISSUER], expiration_seconds=expiration_seconds)
            )
            resp = await client.CoreV1Api(api).create_namespaced_service_account_token(name, namespace, body)
        return str(resp.status.token)

    async def write_service_account_kubeconfig(
        self, namespace: str, name: str, *, path: Path | None = None, expiration_seconds: int = 3600
    ) -> Path:
        """Mint a token for ``namespace/name`` and write a kubeconfig that authenticates as that SA."""
        token = await self.mint_service_account_token(namespace, name, expiration_seconds=expiration_seconds)
        target = path or self.work_dir / f"sa-{namespace}-{name}.kubeconfig"
        user = f"system:serviceaccount:{namespace}:{name}"
        _write_kubeconfig(target, kubeconfig_dict(self.server_url, user, token, namespace))
        return target

    # -- internals --------------------------------------------------------------------------------
    def _reset_attempt(self) -> None:
        for proc in reversed(self._procs):
            stop_process(proc, 10.0)
        self._procs.clear()
        for child in self.work_dir.iterdir():
            if child.is_dir():
                shutil.rmtree(child)
            else:
                child.unlink()

    def _spawn(self, name: str, argv: list[str]) -> tuple[subprocess.Popen[bytes], Path]:
        log_path = self.work_dir / f"{name}.log"
        # etcd reads ETCD_* variables as flags; never let the caller's environment reconfigure it.
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD_")}
        # the same session as this process: the finalizer, or a Ctrl-C, stops them with it
        proc = spawn_logged(argv, log_path, env=env, truncate=True, new_session=False)
        self._procs.append(proc)
        return proc, log_path

    def _start_etcd(self, etcd_bin: Path) -> str:
        client_port, peer_port = free_ports(2)
        client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
        proc, log = self._spawn(
            "etcd",
            [
                str(etcd_bin),
                "--name=tokenpools",
                f"--data-dir={self.work_dir / 'etcd'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=tokenpools={peer_url}",
                "--initial-cluster-state=new",
                # A single member still waits one election timeout (default 1 s) before it serves;
                # 20/100 ms cuts etcd start from ~0.8 s to ~0.1 s on loopback.
                "--heartbeat-interval=20",
                "--election-timeout=100",
            ],
        )
        _wait_http(f"{client_url}/health", proc, log, "etcd", timeout=30.0, expect=b'"health":"true"')
        return client_url

    def _start_apiserver(self, kube_bin: Path, etcd_url: str) -> None:
        d = self.work_dir
        (d / "certs").mkdir()
        _openssl("genrsa", "-out", str(d / "sa.key"), "2048")
        _openssl("rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))
        (d / "tokens.csv").write_text(f"{self._admin_token},admin,admin-uid,system:masters\n")
        (port,) = free_ports(1)
        argv = [
            str(kube_bin),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={port}",
            f"--cert-dir={d / 'certs'}",
            f"--token-auth-file={d / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer={SA_ISSUER}",
            f"--api-audiences={SA_ISSUER}",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            # APF bootstraps its FlowSchemas at start: off saves ~0.25 s CPU (~12 %) to /readyz, and load
            # tests then see plain max-in-flight limits instead of per-flow queueing.
            "--enable-priority-and-fairness=false",
            f"--disable-admission-plugins={','.join(_DISABLED_ADMISSION)}",
            # No periodic rewrite of the `kubernetes` Service endpoints (nothing here routes to it).
            "--endpoint-reconciler-type=none",
            "--profiling=false",
            *self._extra_args,
        ]
        proc, log = self._spawn("kube-apiserver", argv)
        self._server_url = f"https://127.0.0.1:{port}"
        _wait_http(
            f"{self._server_url}/readyz",
            proc,
            log,
            "kube-apiserver",
            timeout=self._ready_timeout,
            expect=b"ok",
            token=self._admin_token,
        )
        _write_kubeconfig(self.kubeconfig_path, kubeconfig_dict(self._server_url, "admin", self._admin_token))


def _fast_tmp() -> str | None:
    """/dev/shm when usable: etcd fsyncs on every write and tmpfs makes that free."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _openssl(*args: str) -> None:
    res = subprocess.run(["openssl", *args], capture_output=True, check=False)
    if res.returncode != 0:
        raise KubeStackError(f"openssl {' '.join(args)} failed: {res.stderr.decode(errors='replace')}")


def _write_kubeconfig(path: Path, data: dict[str, Any]) -> None:
    """JSON is valid YAML: kubectl and kubernetes_asyncio read it, and no YAML dependency is needed."""
    path.write_text(json.dumps(data, indent=2))
    path.chmod(0o600)


def _wait_http(
    url: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    what: str,
    *,
    timeout: float,
    expect: bytes,
    token: str | None = None,
) -> None:
    """Poll ``url`` until it answers 200 containing ``expect``; fail fast if ``proc`` exits."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise KubeStackError(f"{what} exited with {proc.returncode}; log tail:\n{log_tail(log, 40)}")
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=2, context=ctx) as r:
                body = r.read()
                if r.status == 200 and expect in body:
                    return
                last = f"HTTP {r.status}: {body[:200]!r}"
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            failing = [ln for ln in text.splitlines() if ln.startswith("[-]")]  # /readyz names failed checks
            last = f"HTTP {e.code}: {'; '.join(failing) or text[:300]}"
        except (OSError, ValueError) as e:
            last = repr(e)
        time.sleep(0.1)
    raise KubeStackError(f"{what} not ready at {url} after {timeout:.0f}s ({last}); log tail:\n{log_tail(log, 40)}")
