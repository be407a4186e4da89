"""The documentation ships with the project and stays true to the code: the README points
only at files in the repository (it once sent users to ``../shared/DESIGN.md``, which no
user has), and the HTTP reference names every route the router and the worker serve."""

from __future__ import annotations

import re
from pathlib import Path

from aiohttp import web

from fairserve.api.worker_extension import ROUTES as EXTENSION_ROUTES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("docs/architecture.md", "docs/operator-guide.md", "docs/http-api.md")


def test_readme_links_to_the_shipped_docs_only() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "../shared" not in readme and "DESIGN" not in readme
    for doc in DOCS:
        assert f"]({doc})" in readme, doc
    for target in re.findall(r"\]\(([^)#]+)\)", readme):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).is_file(), target


def test_docs_link_only_to_files_that_exist() -> None:
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        assert "../shared" not in text, doc
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if not target.startswith(("http://", "https://")):
                assert (ROOT / doc).parent.joinpath(target).is_file(), (doc, target)


def test_the_http_reference_names_every_route() -> None:
    from fairserve.router.handlers import routes
    from fairserve.worker.runtime import WorkerRuntime
    from fairserve.worker.server import build_app
    from tests.worker.helpers import make_config

    reference = (ROOT / "docs/http-api.md").read_text()
    router_paths = {route.path for route in routes() if isinstance(route, web.RouteDef)}
    worker_app = build_app(WorkerRuntime(make_config()))  # routes only; nothing starts
    worker_paths = {resource.canonical for resource in worker_app.router.resources()}
    extension_paths = {path for _, path in EXTENSION_ROUTES}
    every = router_paths | worker_paths | extension_paths
    missing = sorted(path for path in every if path not in reference)
    assert not missing, f"docs/http-api.md does not mention: {missing}"
