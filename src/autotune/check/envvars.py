"""--env-file: environment variables that DeepSpeed, PyTorch, NCCL and CUDA never read.

Known names come from two places. Python code: every literal name the installed DeepSpeed and PyTorch
look up in os.environ, found by scanning their sources (so it follows the installed versions). Native
code (NCCL, the CUDA runtime, PyTorch's C++ core) cannot be scanned on a machine without those
libraries, so their documented names are listed below.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
import shlex
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from autotune.check.findings import Finding, Severity
from autotune.errors import UserError

# Documented variables read by native code (NCCL user guide "Environment Variables"; CUDA programming
# guide "CUDA Environment Variables"; PyTorch C++: ProcessGroupNCCL, CUDACachingAllocator, c10 logging).
_NATIVE_NAMES = """
NCCL_DEBUG NCCL_DEBUG_FILE NCCL_DEBUG_SUBSYS NCCL_CONF_FILE NCCL_SOCKET_IFNAME NCCL_SOCKET_FAMILY
NCCL_SOCKET_NTHREADS NCCL_NSOCKS_PERTHREAD NCCL_SOCKET_RETRY_CNT NCCL_SOCKET_RETRY_SLEEP_MSEC NCCL_CROSS_NIC
NCCL_IB_DISABLE NCCL_IB_HCA NCCL_IB_TIMEOUT NCCL_IB_RETRY_CNT NCCL_IB_GID_INDEX NCCL_IB_ADDR_FAMILY
NCCL_IB_ADDR_RANGE NCCL_IB_ROCE_VERSION_NUM NCCL_IB_SL NCCL_IB_TC NCCL_IB_FIFO_TC NCCL_IB_RETURN_ASYNC_EVENTS
NCCL_IB_QPS_PER_CONNECTION NCCL_IB_SPLIT_DATA_ON_QPS NCCL_IB_ADAPTIVE_ROUTING NCCL_IB_AR_THRESHOLD
NCCL_IB_ECE_ENABLE NCCL_IB_PCI_RELAXED_ORDERING NCCL_IB_MERGE_NICS NCCL_IB_MERGE_VFS NCCL_IB_CUDA_SUPPORT
NCCL_IB_USE_INLINE NCCL_OOB_NET_ENABLE NCCL_OOB_NET_IFNAME NCCL_NET NCCL_NET_PLUGIN NCCL_TUNER_PLUGIN
NCCL_PROFILER_PLUGIN NCCL_ENV_PLUGIN NCCL_NET_GDR_LEVEL NCCL_NET_GDR_READ NCCL_NET_GDR_C2C
NCCL_NET_SHARED_BUFFERS NCCL_NET_SHARED_COMMS NCCL_NET_DISABLE_INTRA NCCL_NET_FORCE_FLUSH NCCL_P2P_DISABLE
NCCL_P2P_LEVEL NCCL_P2P_DIRECT_DISABLE NCCL_P2P_READ_ENABLE NCCL_P2P_NET_CHUNKSIZE NCCL_P2P_NVL_CHUNKSIZE
NCCL_P2P_PCI_CHUNKSIZE NCCL_P2P_PXN_LEVEL NCCL_PXN_DISABLE NCCL_SHM_DISABLE NCCL_SHM_USE_CUDA_MEMCPY
NCCL_BUFFSIZE NCCL_NTHREADS NCCL_MAX_NCHANNELS NCCL_MIN_NCHANNELS NCCL_MAX_RINGS NCCL_MIN_RINGS NCCL_MAX_CTAS
NCCL_MIN_CTAS NCCL_CGA_CLUSTER_SIZE NCCL_NCHANNELS_PER_NET_PEER NCCL_MAX_P2P_NCHANNELS NCCL_MIN_P2P_NCHANNELS
NCCL_CHECKS_DISABLE NCCL_CHECK_POINTERS NCCL_LAUNCH_MODE NCCL_ALGO NCCL_PROTO NCCL_LL_THRESHOLD
NCCL_TREE_THRESHOLD NCCL_SINGLE_RING_THRESHOLD NCCL_NVB_DISABLE NCCL_COLLNET_ENABLE
NCCL_COLLNET_NODE_THRESHOLD NCCL_TOPO_FILE NCCL_TOPO_DUMP_FILE NCCL_IGNORE_CPU_AFFINITY NCCL_SET_THREAD_NAME
NCCL_SET_STACK_SIZE NCCL_GRAPH_MIXING_SUPPORT NCCL_GRAPH_REGISTER NCCL_LOCAL_REGISTER
NCCL_LEGACY_CUDA_REGISTER NCCL_DMABUF_ENABLE NCCL_CUMEM_ENABLE NCCL_CUMEM_HOST_ENABLE NCCL_NVLS_ENABLE
NCCL_NVLS_CHUNKSIZE NCCL_NVLS_NCHANNELS NCCL_MNNVL_ENABLE NCCL_MNNVL_UUID NCCL_MNNVL_CLIQUE_ID
NCCL_RUNTIME_CONNECT NCCL_WORK_FIFO_BYTES NCCL_WORK_FIFO_DEPTH NCCL_COMM_BLOCKING NCCL_COMM_ID NCCL_HOSTID
NCCL_RAS_ENABLE NCCL_RAS_ADDR NCCL_RAS_TIMEOUT_FACTOR NCCL_UID_STAGGER_THRESHOLD NCCL_UID_STAGGER_RATE
NCCL_ASYNC_ERROR_HANDLING NCCL_BLOCKING_WAIT NCCL_CTA_POLICY NCCL_ALLOC_P2P_NET_LL_BUFFERS
CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER CUDA_LAUNCH_BLOCKING CUDA_DEVICE_MAX_CONNECTIONS CUDA_MODULE_LOADING
CUDA_CACHE_DISABLE CUDA_CACHE_PATH CUDA_CACHE_MAXSIZE CUDA_FORCE_PTX_JIT CUDA_DISABLE_PTX_JIT CUDA_AUTO_BOOST
CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
CUDA_DEVICE_WAITS_ON_EXCEPTION CUDA_ENABLE_COREDUMP_ON_EXCEPTION CUDA_COREDUMP_FILE CUDA_SCALE_LAUNCH_QUEUES
CUBLAS_WORKSPACE_CONFIG CUBLASLT_WORKSPACE_SIZE CUDNN_LOGINFO_DBG CUDNN_LOGDEST_DBG PYTORCH_CUDA_ALLOC_CONF
PYTORCH_ALLOC_CONF PYTORCH_HIP_ALLOC_CONF PYTORCH_NO_CUDA_MEMORY_CACHING TORCH_NCCL_ASYNC_ERROR_HANDLING
TORCH_NCCL_BLOCKING_WAIT TORCH_NCCL_HIGH_PRIORITY TORCH_NCCL_AVOID_RECORD_STREAMS TORCH_NCCL_ENABLE_MONITORING
TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC TORCH_NCCL_DUMP_ON_TIMEOUT TORCH_NCCL_TRACE_BUFFER_SIZE
TORCH_NCCL_DEBUG_INFO_TEMP_FILE TORCH_NCCL_DESYNC_DEBUG TORCH_NCCL_ENABLE_TIMING
TORCH_NCCL_USE_COMM_NONBLOCKING TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK
TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC TORCH_NCCL_COORD_CHECK_MILSEC TORCH_SHOW_CPP_STACKTRACES
TORCH_CPP_LOG_LEVEL TORCH_LOGS TORCH_DISTRIBUTED_DEBUG TORCH_USE_CUDA_DSA TORCH_BLAS_PREFER_CUBLASLT
TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT TORCH_ALLOW_TF32_CUBLAS_OVERRIDE GROUP_RANK ROLE_NAME ROLE_WORLD_SIZE
LOCAL_WORLD_SIZE OMP_NUM_THREADS OMP_PROC_BIND OMP_PLACES KMP_AFFINITY KMP_BLOCKTIME MKL_NUM_THREADS
"""

# Name families owned by these four stacks: an unknown name here is most likely a misspelling.
_STACK_PREFIXES = (
    "NCCL_", "CUDA_", "CUDNN_", "CUBLAS", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_",
    "TORCHELASTIC_", "DS_", "DEEPSPEED_", "GLOO_",
)  # fmt: skip

_CLOSE_MATCH = 0.88  # difflib ratio for "did you mean"; names differing by a letter or two
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ENV_LOOKUP = re.compile(
    r"""(?:environ(?:\.get|\.setdefault|\.pop)?\s*[(\[]\s*|getenv\(\s*)["']([A-Z][A-Z0-9_]{2,})["']"""
)


@dataclass(frozen=True)
class EnvAssignment:
    name: str
    value: str
    line: int


@cache
def _scanned_names(package: str) -> frozenset[str]:
    """Literal names a package's Python sources look up in the environment."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return frozenset()
    names: set[str] = set()
    for source in Path(spec.origin).parent.rglob("*.py"):
        try:
            text = source.read_text(encoding="utf-8", errors="ignore")
        except OSError:
            continue
        if "environ" in text or "getenv" in text:
            names.update(_ENV_LOOKUP.findall(text))
    return frozenset(names)


def known_names() -> frozenset[str]:
    return frozenset(_NATIVE_NAMES.split()) | _scanned_names("deepspeed") | _scanned_names("torch")


def _assignments_in(line: str) -> list[tuple[str, str]]:
    """NAME=VALUE pairs a shell line sets: `export A=1 B=2`, `A=1 cmd ...`, `#SBATCH --export=A=1,B=2`."""
    stripped = line.strip()
    if stripped.startswith("#SBATCH") and "--export=" in stripped:
        items = stripped.split("--export=", 1)[1].split()[0].split(",")
        exported = [item.split("=", 1) for item in items if "=" in item]
        return [(name, value) for name, value in exported if _NAME.match(name)]
    if not stripped or stripped.startswith("#"):
        return []
    try:
        tokens = shlex.split(stripped, comments=True)
    except ValueError:
        return []
    while tokens and tokens[0] in ("export", "env", "declare", "-x", "setenv"):
        tokens = tokens[1:]
    pairs: list[tuple[str, str]] = []
    for token in tokens:
        name, equals, value = token.partition("=")
        if not equals or not _NAME.match(name):
            break
        pairs.append((name, value))
    return pairs


def parse_env_file(path: str | Path) -> list[EnvAssignment]:
    """Every variable a job script or env list sets; other lines are ignored."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        raise UserError(f"cannot read env file {path}: {error.strerror or error}") from None
    assignments: list[EnvAssignment] = []
    for number, line in enumerate(text.splitlines(), start=1):
        assignments += [EnvAssignment(name, value, number) for name, value in _assignments_in(line)]
    return assignments


def env_findings(assignments: list[EnvAssignment]) -> list[Finding]:
    known = known_names()
    findings: list[Finding] = []
    for assignment in assignments:
        name = assignment.name
        if name in known:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=_CLOSE_MATCH)
        where = f"line {assignment.line}: "
        if close:
            message = f"{where}read by none of DeepSpeed, PyTorch, NCCL or CUDA. Did you mean {close[0]}?"
            findings.append(Finding(Severity.WARNING, f"${name}", message, "env"))
        elif name.startswith(_STACK_PREFIXES):
            message = f"{where}not a variable DeepSpeed, PyTorch, NCCL or CUDA is known to read; check the spelling."
            findings.append(Finding(Severity.WARNING, f"${name}", message, "env"))
        else:
            message = f"{where}read by none of DeepSpeed, PyTorch, NCCL or CUDA (fine if your own code reads it)."
            findings.append(Finding(Severity.INFO, f"${name}", message, "env"))
    return findings
