"""Node-side payloads: stdlib-only Python scripts shipped through stdin, printing JSON."""
from importlib.resources import files


class Payload(str):
    """A payload's source text that knows its name, so messages can name it instead of showing it."""

    name: str


def load(name: str) -> Payload:
    """The source text of payload `name` (a module in this package), ready to ship."""
    payload = Payload(files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8"))
    payload.name = name
    return payload
