"""Node-side payloads: stdlib-only Python scripts shipped through stdin, printing JSON."""
from importlib.resources import files


def load(name: str) -> str:
    """The source text of payload `name` (a module in this package), ready to ship."""
    return files(__name__).joinpath(f"{name}.py").read_text(encoding="utf-8")
