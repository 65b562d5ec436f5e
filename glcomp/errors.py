"""The one error type users see for mistakes in models, inputs, bundles and shaders."""


class GlcompError(ValueError):
    """A mistake in what the user gave: the message names the model part, tensor or file at fault."""


def near_names(name: str, known: object) -> str:
    """A hint for an error about an unknown `name`: the `known` names (an iterable of strings)
    closest to it, else a few of them (names starting with ``%``, node ids, listed last)."""
    import difflib

    names = sorted(set(known), key=lambda k: (k.startswith("%"), len(k), k))  # type: ignore[call-overload]
    close = difflib.get_close_matches(name, names, n=6, cutoff=0.5)
    shown = close or [k for k in names if not k.startswith("%")][:12]
    what = "near matches" if close else "known names include"
    return f"{what}: {', '.join(repr(k) for k in shown)}" if shown else "no names are known"
