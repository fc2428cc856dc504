"""Where the views' front end lives: the ES modules and stylesheets of ``js/``, in a wheel or a
source checkout (one small module, so both the widgets and the static inliner read them)."""

from __future__ import annotations

import importlib.resources


def assets():
    """The folder of the views' ES modules and stylesheet.

    An installed copy (wheel) carries them as the package ``jaxpar_magic.js``. A source checkout
    (``pip install -e .``, or ``python -m pytest`` from the repository root) has them in the
    top-level ``js/`` folder beside the package, which is where we look when that package is absent.
    """
    try:
        return importlib.resources.files("jaxpar_magic.js")
    except ModuleNotFoundError:
        pass
    checkout = importlib.resources.files("jaxpar_magic").parent / "js"
    if checkout.joinpath("views.css").is_file():
        return checkout
    raise ModuleNotFoundError(
        "jaxpar_magic's widget code is missing: neither the installed package data `jaxpar_magic.js` nor a "
        f"source checkout's js/ folder ({checkout}) was found. Reinstall the package (`pip install jaxpar_magic`, "
        "or `pip install -e .` in a checkout)."
    )


def read_asset(name: str) -> str:
    """Text of one file of the views' front end (``js/`` in the repository)."""
    return assets().joinpath(name).read_text(encoding="utf-8")
