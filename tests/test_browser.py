"""Compatibility for test files written while tests/ was flat: they import the browser fixtures and
helpers with ``from test_browser import ...``. The fixtures (`browser`, `site`, `page`) now live in
tests/conftest.py, which every test sees without an import, and the helpers in
tests/browser/support.py (``from browser.support import _js, Site``); the browser runtime's own
tests are tests/browser/test_browser.py. New tests import neither from here."""

from __future__ import annotations

from browser.support import CHROMIUM_ARGS, HIDE, Site, _batches, _cnn, _get, _js, _mlp, _save
from conftest import browser, page, site

__all__ = [
    "CHROMIUM_ARGS",
    "HIDE",
    "Site",
    "_batches",
    "_cnn",
    "_get",
    "_js",
    "_mlp",
    "_save",
    "browser",
    "page",
    "site",
]
