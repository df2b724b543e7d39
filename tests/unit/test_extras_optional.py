"""The core runs without the extras: nothing in the package imports prometheus-client or
OpenTelemetry but the extras' own modules, and those say which extra to install. Checked in a
fresh interpreter in which both packages cannot be imported, as where they are not installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PROGRAM = textwrap.dedent(
    """
    import importlib.abc, sys

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("prometheus_client", "opentelemetry"):
                raise ModuleNotFoundError(f"No module named {name!r}")
            return None

    sys.meta_path.insert(0, Absent())

    import nursery_jobs as nj

    app = nj.App()

    @app.job()
    async def work(ctx):
        pass

    async def main(rt):
        print((await rt.wait(await work.enqueue(), timeout=5)).state.value)

    nj.run(main, app=app)
    for module, extra in (("nursery_jobs.contrib.prometheus", "prometheus"), ("nursery_jobs.contrib.otel", "otel")):
        try:
            __import__(module)
        except ImportError as exc:
            print(extra, f"nursery_jobs[{extra}]" in str(exc))
    print(sorted(m for m in sys.modules if m.split(".")[0] in ("prometheus_client", "opentelemetry")))
    """
)


def test_the_core_runs_without_the_extras_and_each_extra_names_what_to_install() -> None:
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n") == ["completed", "prometheus True", "otel True", "[]", ""]
