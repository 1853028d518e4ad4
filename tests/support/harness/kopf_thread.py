"""
Run a kopf operator in its own thread with its own event loop.

Not as a task in the test's event loop: on shutdown ``kopf.operator()`` cancels every task
created after it started, which would include the emulator's request handlers.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import pathlib
import threading
import time
from collections.abc import Callable, Collection, Iterator
from typing import Any

import kopf
from kopf._core.intents import causes  # kopf is pinned exactly; Activity is not exported

SettingsHook = Callable[[kopf.OperatorSettings], None]


def fast_test_settings(settings: kopf.OperatorSettings) -> None:
    """Timeouts and backoffs small enough for tests; only warnings are posted as k8s Events."""
    settings.watching.server_timeout = 10  # watches end server-side now and then, so reconnects get exercised
    settings.watching.client_timeout = 15
    settings.watching.connect_timeout = 2
    settings.watching.reconnect_backoff = 0.1
    settings.networking.connect_timeout = 2
    settings.networking.request_timeout = 10
    settings.networking.error_backoffs = (0.1, 0.2, 0.5, 1.0)
    settings.posting.level = logging.WARNING  # INFO events per handler would double the write count
    settings.persistence.consistency_timeout = 2.0
    settings.queueing.exit_timeout = 1.0
    settings.process.ultimate_exiting_timeout = 5.0
    settings.background.instant_exit_timeout = 1.0


@contextlib.contextmanager
def _kubeconfig_pointing_at(path: pathlib.Path) -> Iterator[None]:
    """
    Point both KUBECONFIG and the kubernetes client's import-time copy of it at ``path``:
    kopf's default login goes through ``kubernetes.config.load_kube_config()``, which reads
    the location cached when ``kubernetes.config`` was first imported, not the environment.
    """
    import kubernetes.config.kube_config as kube_config
    saved_env = os.environ.get('KUBECONFIG')
    saved_default = kube_config.KUBE_CONFIG_DEFAULT_LOCATION
    os.environ['KUBECONFIG'] = str(path)
    kube_config.KUBE_CONFIG_DEFAULT_LOCATION = str(path)
    try:
        yield
    finally:
        kube_config.KUBE_CONFIG_DEFAULT_LOCATION = saved_default
        if saved_env is None:
            os.environ.pop('KUBECONFIG', None)
        else:
            os.environ['KUBECONFIG'] = saved_env


def _ensure_login_handler(registry: kopf.OperatorRegistry) -> None:
    """
    A bare ``kopf.OperatorRegistry()`` has no login handlers (only kopf's default registry
    gets the fallback ones), so give it the kubeconfig login, which reads KUBECONFIG.
    """
    logins = [handler for handler in registry._activities.get_all_handlers()
              if handler.activity == causes.Activity.AUTHENTICATION]
    if not logins:
        kopf.on.login(registry=registry, id='login_with_kubeconfig')(kopf.login_with_kubeconfig)


class KopfThread:
    """
    ``kopf.operator(standalone=True, clusterwide=True)`` in a thread, started and stopped by the test::

        registry = kopf.OperatorRegistry()  # gets a kubeconfig login handler if it has none
        @kopf.on.create('katasizing.dev', 'v1alpha1', 'katasizingpolicies', registry=registry)
        async def created(**_): ...

        with KopfThread(emu.kubeconfig, registry=registry) as operator:
            ...  # the operator is connected and watching here

    Or ``KopfThread(emu.kubeconfig, module='kata_sizing.operator')``: the module is imported
    (once per process, as Python does) and kopf's default registry, which its decorators
    filled, is used. ``settings_hook`` runs after ``fast_test_settings`` and may change anything;
    the operator's own ``@kopf.on.startup`` handlers run later still.
    """

    def __init__(
        self,
        kubeconfig: str | pathlib.Path,
        *,
        registry: kopf.OperatorRegistry | None = None,
        module: str | None = None,
        settings_hook: SettingsHook | None = None,
        clusterwide: bool = True,
        namespaces: Collection[str] = (),
        standalone: bool = True,
        memo: Any = None,
        startup_timeout: float = 15,
        stop_timeout: float = 10,
    ) -> None:
        if (registry is None) == (module is None):
            raise ValueError("Pass exactly one of `registry` or `module`.")
        self.kubeconfig = pathlib.Path(kubeconfig)
        self.module = module
        self.registry = registry
        self.settings = kopf.OperatorSettings()
        fast_test_settings(self.settings)
        if settings_hook is not None:
            settings_hook(self.settings)
        self.clusterwide = clusterwide if not namespaces else False
        self.namespaces = namespaces
        self.standalone = standalone
        self.memo = memo
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.ready_flag = threading.Event()
        self.stop_flag = threading.Event()
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._environment = contextlib.ExitStack()

    def __enter__(self) -> KopfThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("The operator thread is already started.")
        if self.module is not None:
            importlib.import_module(self.module)
            self.registry = kopf.get_default_registry()
        assert self.registry is not None
        _ensure_login_handler(self.registry)
        self._environment.enter_context(_kubeconfig_pointing_at(self.kubeconfig))
        self._thread = threading.Thread(target=self._run, name='kopf-operator', daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.ready_flag.wait(0.05):
            if not self._thread.is_alive():
                error = self.error
                self.stop_flag.set()
                self._thread = None
                self._environment.close()
                raise RuntimeError(f"The operator exited before it was ready: {error!r}") from error
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError("The operator did not become ready in time.")

    def _run(self) -> None:
        try:
            asyncio.run(kopf.operator(
                registry=self.registry,
                settings=self.settings,
                standalone=self.standalone,
                clusterwide=self.clusterwide,
                namespaces=self.namespaces,
                memo=self.memo,
                stop_flag=self.stop_flag,
                ready_flag=self.ready_flag,
            ))
        except BaseException as e:
            self.error = e

    def stop(self) -> None:
        """Stop the operator; re-raises what made it crash, if anything did."""
        if self._thread is None:
            return
        self.stop_flag.set()
        self._thread.join(self.stop_timeout)
        alive = self._thread.is_alive()
        if not alive:  # kopf leaves the pool of its sync handlers (logins included) running
            self.settings.execution.executor.shutdown(wait=True)
        self._thread = None
        self._environment.close()
        if alive:
            raise TimeoutError("The operator thread did not stop in time.")
        if self.error is not None:
            raise RuntimeError(f"The operator failed: {self.error!r}") from self.error
