"""The markers of vpsshop's pluggy project, in one place: ``hookimpl`` for implementations (plugin authors
import it as ``from vpsshop import hookimpl``) and ``hookspec`` for the specifications in
:mod:`vpsshop.hookspecs`. Kept apart from the specifications, which name every type a hook passes, so
that core's own hook implementations need nothing above them."""

from __future__ import annotations

import pluggy

__all__ = ["PROJECT", "hookimpl", "hookspec"]

PROJECT = "vpsshop"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
