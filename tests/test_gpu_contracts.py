"""API contracts of the GPU payloads, checked without a GPU (issue 16).

Every GPU path has so far run only on recorded outputs and CPUs, so a misspelt NVML function or
a torch.cuda attribute that moved would first show on a customer's GPU node. Here the payloads'
own sources are parsed with `ast` (no list kept by hand): every `pynvml` name they use exists in
the installed nvidia-ml-py and each NVML call takes the arguments it is given
(inspect.signature), and every `torch.cuda` / `torch.distributed` / `torch.backends.cuda` name
exists in the installed torch. Then each GPU payload is run as the node runs it, on this CPU-only
machine, and must end with its own one-line message, never a traceback.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from inventory.model import Expectations, Node
from runners import burn, collectives, gemm_fft, nvml, payloads, training
from runners.transport import LocalTransport, Result

pynvml = pytest.importorskip("pynvml", reason="nvidia-ml-py is in the test extra (make test installs it)")
torch = pytest.importorskip("torch", reason="torch is in the test extra (make test installs it)")

PAYLOADS_DIR = Path(payloads.__file__).resolve().parent
TORCH_PAYLOADS = ("gpu_burn", "gpu_bandwidth", "gemm_fft", "collectives", "train_gpt")
GPU_PAYLOADS = ("gpu_facts", "soak_supervisor", *TORCH_PAYLOADS)  # the soak's telemetry and Xid watch: NVML
TORCH_SPACES = (("torch", "cuda"), ("torch", "distributed"), ("torch", "backends", "cuda"))
EXPECT_NOTHING = Expectations()
FAILURE_WORDS = ("Traceback", "NameError", "ImportError", "AttributeError", "TypeError")


def chain(node: ast.AST) -> Optional[list[str]]:
    """['self', 'torch', 'cuda', 'Event'] for self.torch.cuda.Event; None unless names all the way."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


@dataclass(frozen=True)
class NvmlCall:
    payload: str
    line: int
    function: str  # the pynvml name
    positional: int
    keywords: tuple[str, ...]


class Uses(ast.NodeVisitor):
    """The module paths a payload's source reaches (pynvml.X, torch.cuda.Y ...) and its NVML calls.

    Names are resolved through the payload's imports (`import torch.distributed as dist`), through
    assignments of a module or an NVML function to a name or attribute (`self._nvml = pynvml`,
    `ecc_total = pynvml.nvmlDeviceGetTotalEccErrors`), and through `torch` passed as a parameter.
    An NVML function handed to a wrapper (`attempt(pynvml.F, handle, ...)`) is called with the
    wrapper's arguments after it.
    """

    def __init__(self, payload: str, tree: ast.Module):
        self.payload = payload
        self.aliases: dict[str, str] = {"torch": "torch", "pynvml": "pynvml"}
        self.paths: dict[str, int] = {}  # dotted path -> first line
        self.calls: list[NvmlCall] = []
        known = -1
        while known != len(self.aliases):  # aliases first, to a fixed point: `nvml = self.nvml` may
            known = len(self.aliases)      # come before the `self.nvml = pynvml` it rests on
            for node in ast.walk(tree):
                self._alias(node)
        self.visit(tree)

    def _alias(self, node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for name in node.names:
                if name.asname:
                    self.aliases[name.asname] = name.name
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            value = node.value.values[-1] if isinstance(node.value, ast.BoolOp) else node.value
            target, source = chain(node.targets[0]), chain(value)
            if target and source and self.resolve(source):
                self.aliases[".".join(target)] = ".".join(self.resolve(source) or [])

    def resolve(self, parts: list[str]) -> Optional[list[str]]:
        """The module path of a name chain, or None when it is no module's."""
        for cut in range(len(parts), 0, -1):
            alias = self.aliases.get(".".join(parts[:cut]))
            if alias:
                return alias.split(".") + parts[cut:]
        if "torch" in parts[1:]:  # self.torch.cuda.Event: torch held by an object
            return parts[parts.index("torch"):]
        return None

    def visit_Attribute(self, node: ast.Attribute) -> None:
        parts = chain(node)
        path = self.resolve(parts) if parts else None
        if path:
            self.paths.setdefault(".".join(path), node.lineno)
            return  # the longest chain only: torch.cuda.Event, not torch.cuda as well
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        called = chain(node.func)
        path = self.resolve(called) if called else None
        if path and path[0] == "pynvml" and len(path) == 2:
            self._call(node, path[1], len(node.args))
        for position, argument in enumerate(node.args):
            handed = chain(argument)
            handed_path = self.resolve(handed) if handed else None
            if handed_path and handed_path[0] == "pynvml" and len(handed_path) == 2 \
                    and handed_path[1].startswith("nvml") and callable(getattr(pynvml, handed_path[1], None)):
                self._call(node, handed_path[1], len(node.args) - position - 1)
        self.generic_visit(node)

    def _call(self, node: ast.Call, function: str, positional: int) -> None:
        self.calls.append(NvmlCall(self.payload, node.lineno, function, positional,
                                   tuple(k.arg for k in node.keywords if k.arg)))


def uses(payload: str) -> Uses:
    source = (PAYLOADS_DIR / f"{payload}.py").read_text(encoding="utf-8")
    return Uses(payload, ast.parse(source))


USES = {payload: uses(payload) for payload in GPU_PAYLOADS}


def lookup(path: str):
    """The object at a dotted path of an installed module; raises AttributeError when absent."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise AttributeError(f"no module for {path}")


def used_paths(space: tuple[str, ...]) -> list[tuple[str, str, int]]:
    """(payload, dotted path, line) of every use under `space` in the GPU payloads."""
    prefix = ".".join(space) + "."
    return [(payload, path, line) for payload, found in USES.items()
            for path, line in sorted(found.paths.items()) if path.startswith(prefix)]


def test_the_parser_finds_the_names_the_payloads_use():
    """The ast walk is what the checks below rest on: it sees the uses through every alias form."""
    facts, bandwidth = USES["gpu_facts"], USES["gpu_bandwidth"]
    assert "pynvml.nvmlDeviceGetTotalEccErrors" in facts.paths  # through `ecc_total = ...`
    assert any(c.function == "nvmlDeviceGetTotalEccErrors" and c.positional == 3 for c in facts.calls)
    assert any(c.function == "nvmlDeviceGetTemperature" and c.positional == 2 for c in facts.calls)
    assert "pynvml.nvmlDeviceGetUtilizationRates" in USES["train_gpt"].paths  # self._nvml = pynvml
    soak = USES["soak_supervisor"]  # nvml = self.nvml, where self.nvml = pynvml comes later
    assert {"pynvml.nvmlEventSetWait", "pynvml.NVMLError_Timeout",
            "pynvml.nvmlDeviceGetRemappedRows"} <= set(soak.paths)
    assert any(c.function == "nvmlDeviceRegisterEvents" and c.positional == 3 for c in soak.calls)
    assert "torch.distributed.all_reduce" in USES["collectives"].paths  # import ... as dist
    assert "torch.cuda.Event" in USES["gemm_fft"].paths  # self.torch.cuda.Event
    assert {"torch.cuda.device", "torch.cuda.current_stream"} <= set(bandwidth.paths)
    assert len(used_paths(("pynvml",))) > 40 and len(used_paths(("torch", "cuda"))) > 10


@pytest.mark.parametrize("payload, path, line", used_paths(("pynvml",)),
                         ids=lambda value: value if isinstance(value, str) else "")
def test_every_nvml_name_exists_in_nvidia_ml_py(payload, path, line):
    assert hasattr(pynvml, path.split(".", 1)[1]), f"{payload}.py:{line}: {path} is not in nvidia-ml-py"


@pytest.mark.parametrize("call", [call for found in USES.values() for call in found.calls],
                         ids=lambda call: f"{call.payload}:{call.line}:{call.function}")
def test_every_nvml_call_takes_the_arguments_it_is_given(call):
    function = getattr(pynvml, call.function)
    signature = inspect.signature(function)
    try:
        signature.bind(*[None] * call.positional, **dict.fromkeys(call.keywords))
    except TypeError as exc:
        pytest.fail(f"{call.payload}.py:{call.line}: {call.function}{signature} cannot take "
                    f"{call.positional} positional argument(s) {call.keywords or ''}: {exc}")


@pytest.mark.parametrize("payload, path, line", [use for space in TORCH_SPACES for use in used_paths(space)],
                         ids=lambda value: value if isinstance(value, str) else "")
def test_every_torch_cuda_and_distributed_name_exists_in_torch(payload, path, line):
    try:
        lookup(path)
    except AttributeError as exc:
        pytest.fail(f"{payload}.py:{line}: {path} is not in torch {torch.__version__}: {exc}")


@pytest.mark.parametrize("payload", TORCH_PAYLOADS)
def test_every_gpu_payload_sets_the_pci_bus_device_order_before_importing_torch(payload):
    """CUDA's default order (fastest first) need not be NVML's: with CUDA_DEVICE_ORDER=PCI_BUS_ID
    set before torch starts CUDA, "GPU 3" is the same physical GPU in every check. torch is
    imported by an import statement or by torch_import's import_torch()."""
    tree = ast.parse((PAYLOADS_DIR / f"{payload}.py").read_text(encoding="utf-8"))
    settings = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and ast.unparse(node) == "os.environ['CUDA_DEVICE_ORDER'] = 'PCI_BUS_ID'"]

    def names_torch(node: ast.AST) -> bool:
        if isinstance(node, ast.Call):
            return ast.unparse(node.func) == "import_torch"
        if isinstance(node, ast.Import):
            return any(alias.name.split(".")[0] == "torch" for alias in node.names)
        return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch"

    imports = [node.lineno for node in ast.walk(tree) if names_torch(node)]
    assert settings and imports and min(settings) < min(imports), (payload, settings, imports)


def test_the_nvml_error_names_the_harness_matches_exist():
    """runners/nvml.py names a lost GPU by the class NVML's GPU_IS_LOST code maps to (spelt
    GpuIsLost in nvidia-ml-py, whatever the C name says)."""
    lost = pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
    assert type(lost).__name__ == "NVMLError_GpuIsLost" and str(lost) == "GPU is lost"
    assert "fallen off the bus" in nvml.inventory_problems(nvml.GpuFacts(True, "", gpus=[
        nvml.parse_gpu_facts(json.dumps({"gpus": [{"index": 0, "error": type(lost).__name__,
                                                    "msg": str(lost)}]})).gpus[0]]), EXPECT_NOTHING)[0]
    assert type(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)).__name__ == "NVMLError_LibraryNotFound"


# ---------------------------------------------------------------- each payload as the node runs it


def here() -> LocalTransport:
    return LocalTransport(Node("here", "here", "local", python=sys.executable))


def last_message(result: Result) -> dict:
    """The payload's own last line: one JSON object on stdout, and nothing that is a crash."""
    assert not any(word in result.stderr for word in FAILURE_WORDS), result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert lines, f"no output (exit {result.exit_code}); stderr: {result.stderr[-2000:]}"
    message = json.loads(lines[-1])
    assert isinstance(message, dict)
    return message


def test_gpu_facts_ends_with_its_own_message_about_nvml():
    result = nvml.probe(here())
    assert result.exit_code == 0
    message = last_message(result)
    assert message["available"] is False and message["error"] == "NVMLError_LibraryNotFound"


@pytest.mark.parametrize("run", [lambda t: burn.run(t, 1), burn.bandwidth], ids=["gpu_burn", "gpu_bandwidth"])
def test_burn_and_bandwidth_end_with_their_own_message_at_the_first_cuda_call(run):
    result = run(here())
    assert result.exit_code == 0
    assert last_message(result) == {"available": False,
                                    "reason": f"torch {torch.__version__} finds no CUDA device"}


def test_gemm_fft_runs_its_cpu_path_to_its_own_json_line():
    result = gemm_fft.run(here(), gemm_size=64, fft_shape=(2, 32, 32), timeout=gemm_fft.CPU_TIMEOUT_S)
    assert result.exit_code == 0
    message = last_message(result)
    assert message["device"] == "cpu" and message["devices"][0].get("error") is None


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_collectives_probe_and_one_rank_run_end_with_their_own_json_lines():
    probe = last_message(collectives.probe(here()))
    assert probe["torch"] == torch.__version__ and probe["cuda_devices"] == 0
    result = collectives.run_on_node(here(), 1, sizes=(1 << 16,), iters=1, timeout=180)
    assert result.exit_code == 0
    assert last_message(result)["backend"] == "gloo"


def test_train_gpt_runs_its_cpu_path_to_its_own_json_line():
    tiny = training.ModelConfig(vocab=64, width=32, layers=1, heads=2, seq=16, batch=2, steps=2, lr=1e-3)
    result = training.run_on_node(here(), 1, tiny, timeout=300)
    assert result.exit_code == 0, result.stderr[-2000:]
    message = last_message(result)
    assert message["training"] is True and message["backend"] == "gloo"
