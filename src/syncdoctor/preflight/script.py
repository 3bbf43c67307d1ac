"""What the script checks see of one Python file: its syntax tree, its imports as
an alias map, every call with the control context it sits in, and two data-flow
facts computed once (which expressions depend on the rank, which on the world size).

Everything is syntactic and file-local, except the "facts" (a seed set, set_epoch
called, ...) that the runner unions over all files checked together: a seed set in
`utils.py` seeds the process that runs `train.py`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

# Environment variables, names and calls that carry the rank of this process.
RANK_ENV = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "RANK_ID",
        "DEVICE_ID",
        "NODE_RANK",
        "GROUP_RANK",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "SLURM_PROCID",
        "SLURM_LOCALID",
        "PMI_RANK",
        "MS_NODE_ID",
    }
)
RANK_NAMES = frozenset(
    {
        "rank",
        "local_rank",
        "global_rank",
        "rank_id",
        "local_rank_id",
        "node_rank",
        "process_index",
        "local_process_index",
        "is_master",
        "is_main",
        "is_main_process",
        "is_local_main_process",
        "main_process",
        "master_process",
        "is_rank_zero",
        "is_global_zero",
        "is_rank0",
    }
)
RANK_CALLS = frozenset(
    {
        "get_rank",
        "get_local_rank",
        "get_global_rank",
        "get_rank_id",
        "get_local_rank_id",
        "get_node_rank",
        "is_main_process",
        "is_master",
        "is_rank_zero",
    }
)
WORLD_ENV = frozenset(
    {
        "WORLD_SIZE",
        "RANK_SIZE",
        "DEVICE_NUM",
        "LOCAL_WORLD_SIZE",
        "OMPI_COMM_WORLD_SIZE",
        "SLURM_NTASKS",
        "MS_WORKER_NUM",
    }
)
WORLD_NAMES = frozenset(
    {
        "world_size",
        "group_size",
        "rank_size",
        "device_num",
        "num_replicas",
        "num_processes",
        "nprocs",
        "n_gpu",
        "ngpus",
        "num_gpus",
        "num_devices",
        "global_batch_size",
        "global_batch",
        "total_batch_size",
        "effective_batch_size",
        "num_shards",
    }
)
WORLD_CALLS = frozenset(
    {
        "get_world_size",
        "get_group_size",
        "get_rank_size",
        "get_device_num",
        "get_local_world_size",
    }
)
# Calls through which a value keeps its dependence (int(os.environ["RANK"]), ...).
_PASS_THROUGH = frozenset({"int", "float", "str", "bool", "abs", "min", "max", "round"})

COLLECTIVES = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_object",
        "all_gather_into_tensor",
        "all_to_all",
        "all_to_all_single",
        "broadcast",
        "broadcast_object_list",
        "reduce",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "barrier",
        "monitored_barrier",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "new_group",
    }
)
# MindSpore's collective primitives are classes: `AllReduce()` makes the op.
MS_COLLECTIVE_OPS = frozenset(
    {
        "AllReduce",
        "AllGather",
        "Broadcast",
        "ReduceScatter",
        "AlltoAll",
        "Barrier",
        "Reduce",
        "CollectiveGather",
        "CollectiveScatter",
    }
)
_DP_NAMES = frozenset(
    {
        "init_process_group",
        "DistributedDataParallel",
        "DDP",
        "DistributedSampler",
        "FullyShardedDataParallel",
        "FSDP",
        "set_auto_parallel_context",
        "DistributedGradReducer",
    }
)


@dataclass(frozen=True)
class _Sources:
    env: frozenset[str]
    names: frozenset[str]
    calls: frozenset[str]
    control: bool  # values assigned under a dependent `if` depend on it too
    uniform_tests: bool  # `x == -1`, `x is None`, `x >= 0` ask "distributed?", not "which rank?"


RANK = _Sources(RANK_ENV, RANK_NAMES, RANK_CALLS, control=True, uniform_tests=True)
WORLD = _Sources(WORLD_ENV, WORLD_NAMES, WORLD_CALLS, control=False, uniform_tests=False)

Branch = tuple[ast.If, str]
# Nodes that never contain a call or an assignment: not worth walking into.
_LEAVES = frozenset(
    {
        ast.Name,
        ast.Constant,
        ast.Load,
        ast.Store,
        ast.Del,
        ast.Pass,
        ast.Break,
        ast.Continue,
        ast.alias,
        ast.Global,
        ast.Nonlocal,
        *(c for base in (ast.operator, ast.unaryop, ast.cmpop, ast.boolop) for c in base.__subclasses__()),
    }
)  # an enclosing `if` and the arm: "body" or "orelse"


@dataclass(eq=False)
class CallInfo:
    node: ast.Call
    name: str  # last part of the callee: "shard", "all_reduce", "DataLoader"
    dotted: str | None  # the callee as written when it is a dotted name: "dist.all_reduce"
    qual: str | None  # `dotted` with its first name resolved through the imports
    branches: tuple[Branch, ...]  # enclosing ifs, outermost first
    loops: tuple[ast.AST, ...]
    func: ast.AST | None  # the enclosing function definition

    @property
    def receiver(self) -> ast.expr | None:
        f = self.node.func
        return f.value if isinstance(f, ast.Attribute) else None

    def kw(self, name: str) -> ast.keyword | None:
        return next((k for k in self.node.keywords if k.arg == name), None)

    def arg(self, index: int, name: str) -> ast.expr | None:
        """A parameter given by keyword or position."""
        k = self.kw(name)
        if k is not None:
            return k.value
        args = self.node.args
        return args[index] if len(args) > index and not isinstance(args[index], ast.Starred) else None

    def under(self, *roots: str) -> bool:
        """Resolved to a name inside one of the packages `roots` (torch, mindspore...)."""
        return self.qual is not None and any(self.qual == r or self.qual.startswith(r + ".") for r in roots)

    def has_kwargs_splat(self) -> bool:
        return any(k.arg is None for k in self.node.keywords)


@dataclass(eq=False)
class _Assign:
    target: ast.expr
    value: ast.expr | None
    branches: tuple[Branch, ...]
    key: str | None = None  # dotted_name(target), computed once


def dotted_name(expr: ast.AST | None) -> str | None:
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return ".".join(reversed(parts))


def terminal_name(expr: ast.AST | None) -> str | None:
    """`self.optimizer` -> "optimizer", `opt` -> "opt", anything else -> None."""
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def literal(expr: ast.AST | None) -> object:
    """The value of a constant expression (True, 0.1, "O2", -1), else the sentinel NOT_LITERAL."""
    if isinstance(expr, ast.Constant):
        return expr.value
    if (
        isinstance(expr, ast.UnaryOp)
        and isinstance(expr.op, ast.USub)
        and isinstance(expr.operand, ast.Constant)
        and isinstance(expr.operand.value, int | float)
    ):
        return -expr.operand.value
    return NOT_LITERAL


NOT_LITERAL = object()


@dataclass(eq=False)
class ScriptContext:
    path: str
    source: str
    tree: ast.Module
    aliases: dict[str, str] = field(default_factory=dict)
    frameworks: set[str] = field(default_factory=set)
    calls: list[CallInfo] = field(default_factory=list)
    assigns: list[_Assign] = field(default_factory=list)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    facts: set[str] = field(default_factory=set)  # this file's facts
    project_facts: set[str] = field(default_factory=set)  # union over the files checked together
    # Filled by parse() once the tree is collected.
    _rank_dep: set[str] = field(init=False, repr=False)
    _world_dep: set[str] = field(init=False, repr=False)
    _rank_tests: dict[int, bool] = field(init=False, repr=False)

    @classmethod
    def parse(cls, path: str, source: str) -> ScriptContext:
        ctx = cls(path, source, ast.parse(source, filename=path))
        ctx._collect()
        ctx._rank_dep = ctx._propagate(RANK)
        ctx._world_dep = ctx._propagate(WORLD)
        ctx._rank_tests = {}
        ctx.facts = ctx._file_facts()
        ctx.project_facts = set(ctx.facts)
        return ctx

    # -- collection: one walk over the tree ------------------------------------------
    def _collect(self) -> None:
        """One iterative walk that records imports, calls and assignments with the
        `if`s, loops and function around them; calls and assignments end up in
        source order."""
        stack: list[tuple[ast.AST, tuple[Branch, ...], tuple[ast.AST, ...], ast.AST | None]]
        stack = [(self.tree, (), (), None)]
        push = stack.append
        # Dispatched below on its exact type through the alias `t`, which mypy cannot narrow by.
        node: Any
        while stack:
            node, branches, loops, func = stack.pop()
            t = type(node)
            if t is ast.If:
                push((node.test, branches, loops, func))
                for stmt in node.body:
                    push((stmt, (*branches, (node, "body")), loops, func))
                for stmt in node.orelse:
                    push((stmt, (*branches, (node, "orelse")), loops, func))
                continue
            if t is ast.For or t is ast.AsyncFor or t is ast.While:
                head = [node.test] if t is ast.While else [node.target, node.iter]
                for expr in head:
                    push((expr, branches, loops, func))
                for stmt in [*node.body, *node.orelse]:
                    push((stmt, branches, (*loops, node), func))
                continue
            if t is ast.FunctionDef or t is ast.AsyncFunctionDef:
                # A body runs where it is called, not where it is defined.
                for expr in [*node.decorator_list, node.args]:
                    push((expr, branches, loops, func))
                for stmt in node.body:
                    push((stmt, (), (), node))
                continue
            if t is ast.Import or t is ast.ImportFrom:
                self._add_import(node)
                continue
            if t is ast.Call:
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                dotted = dotted_name(f)
                self.calls.append(CallInfo(node, name, dotted, dotted, branches, loops, func))
            elif t is ast.Assign:
                for target in node.targets:
                    self._record_assign(target, node.value, branches)
            elif t is ast.AnnAssign or t is ast.AugAssign or t is ast.NamedExpr:
                self._record_assign(node.target, node.value, branches)
            elif t is ast.ClassDef:
                self.classes[node.name] = node
            for fname in node._fields:
                value = getattr(node, fname, None)
                if type(value) is list:
                    for item in value:
                        if isinstance(item, ast.AST) and type(item) not in _LEAVES:
                            push((item, branches, loops, func))
                elif isinstance(value, ast.AST) and type(value) not in _LEAVES:
                    push((value, branches, loops, func))
        position = lambda n: (n.lineno, n.col_offset)  # noqa: E731
        self.calls.sort(key=lambda c: position(c.node))
        self.assigns.sort(key=lambda a: position(a.target))
        for c in self.calls:  # the imports are all known only now
            c.qual = self.resolve(c.dotted)

    def _add_import(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    self.aliases[a.asname] = a.name
                else:
                    root = a.name.split(".")[0]
                    self.aliases[root] = root
                self._note_framework(a.name)
            return
        mod = "." * node.level + (node.module or "")
        for a in node.names:
            self.aliases[a.asname or a.name] = f"{mod}.{a.name}" if mod else a.name
        if not node.level:
            self._note_framework(mod)

    def _record_assign(self, target: ast.expr, value: ast.expr | None, branches: tuple[Branch, ...]) -> None:
        if (
            isinstance(target, ast.Tuple | ast.List)
            and isinstance(value, ast.Tuple | ast.List)
            and len(target.elts) == len(value.elts)
        ):
            for t, v in zip(target.elts, value.elts, strict=True):
                self._record_assign(t, v, branches)
        elif isinstance(target, ast.Tuple | ast.List):
            for t in target.elts:
                self._record_assign(t, value, branches)
        else:
            self.assigns.append(_Assign(target, value, branches, dotted_name(target)))

    def _note_framework(self, module: str) -> None:
        root = module.split(".")[0]
        if root in ("torch", "mindspore"):
            self.frameworks.add(root)

    # -- names -------------------------------------------------------------------------
    def resolve(self, dotted: str | None) -> str | None:
        """`dist.all_reduce` -> `torch.distributed.all_reduce` given `import torch.distributed
        as dist`; None when the first name was not imported (a local object)."""
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        base = self.aliases.get(head)
        if base is None:
            return None
        return f"{base}.{rest}" if rest else base

    def bound_values(self, expr: ast.AST | None) -> list[ast.expr]:
        """The expression itself, or what the name (`sampler`, `self.sampler`) was assigned."""
        if expr is None:
            return []
        key = dotted_name(expr)
        if key is None:
            return [expr]  # type: ignore[list-item]
        return [a.value for a in self._assigns_to(key) if a.value is not None] or [expr]  # type: ignore[list-item]

    def _assigns_to(self, key: str) -> list[_Assign]:
        index = self.__dict__.get("_assigns_by_key")
        if index is None:
            index = self.__dict__["_assigns_by_key"] = {}
            for a in self.assigns:
                if a.key is not None:
                    index.setdefault(a.key, []).append(a)
        return index.get(key, [])

    def call_of(self, expr: ast.AST | None) -> CallInfo | None:
        if not isinstance(expr, ast.Call):
            return None
        return self._call_index().get(id(expr))

    def _call_index(self) -> dict[int, CallInfo]:
        index = self.__dict__.get("_calls_by_id")
        if index is None:
            index = self.__dict__["_calls_by_id"] = {id(c.node): c for c in self.calls}
        return index

    def calls_named(self, *names: str) -> Iterator[CallInfo]:
        return (c for c in self.calls if c.name in names)

    # -- data flow ---------------------------------------------------------------------
    def _depends(self, expr: ast.AST | None, dep: set[str], src: _Sources) -> bool:
        if expr is None:
            return False
        if isinstance(expr, ast.Name):
            return expr.id in src.names or expr.id in dep
        if isinstance(expr, ast.Attribute):
            return expr.attr in src.names or dotted_name(expr) in dep
        if isinstance(expr, ast.Subscript):
            if self._env_key(expr.value, expr.slice) in src.env:
                return True
            return self._depends(expr.value, dep, src) or self._depends(expr.slice, dep, src)
        if isinstance(expr, ast.Call):
            f = expr.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name in src.calls:
                return True
            if name in ("get", "getenv") and expr.args:
                return (
                    self._env_key(f.value if isinstance(f, ast.Attribute) else f, expr.args[0], getter=True) in src.env
                )
            if name in _PASS_THROUGH and isinstance(f, ast.Name):
                return any(self._depends(a, dep, src) for a in expr.args)
            return False  # any other call: its result is not traced
        if isinstance(expr, ast.Compare):
            if src.uniform_tests and _asks_distributed(expr):
                return False
            return any(self._depends(e, dep, src) for e in (expr.left, *expr.comparators))
        if isinstance(expr, ast.BinOp):
            return self._depends(expr.left, dep, src) or self._depends(expr.right, dep, src)
        if isinstance(expr, ast.UnaryOp):
            return self._depends(expr.operand, dep, src)
        if isinstance(expr, ast.BoolOp | ast.Tuple | ast.List | ast.JoinedStr):
            elts = expr.values if isinstance(expr, ast.BoolOp | ast.JoinedStr) else expr.elts
            return any(self._depends(e, dep, src) for e in elts)
        if isinstance(expr, ast.FormattedValue):
            return self._depends(expr.value, dep, src)
        if isinstance(expr, ast.IfExp):
            return any(self._depends(e, dep, src) for e in (expr.test, expr.body, expr.orelse))
        return False

    def _env_key(self, obj: ast.AST, key: ast.AST, getter: bool = False) -> str | None:
        """ "RANK" for os.environ["RANK"], os.environ.get("RANK"), os.getenv("RANK")."""
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            return None
        d = dotted_name(obj) or ""
        q = self.resolve(d) or d
        if q.endswith("environ") or (getter and q in ("os", "os.getenv", "getenv")):
            return key.value
        return None

    def _propagate(self, src: _Sources) -> set[str]:
        """Names (and dotted attributes) whose value depends on `src`, to a fixed point."""
        dep: set[str] = set()
        for _ in range(8):
            before = len(dep)
            for a in self.assigns:
                key = a.key
                if key is None or key in dep:
                    continue
                if self._depends(a.value, dep, src) or (
                    src.control and any(self._depends(b.test, dep, src) for b, _ in a.branches)
                ):
                    dep.add(key)
            if len(dep) == before:
                break
        return dep

    def rank_dependent(self, expr: ast.AST | None) -> bool:
        return self._depends(expr, self._rank_dep, RANK)

    def world_dependent(self, expr: ast.AST | None) -> bool:
        return self._depends(expr, self._world_dep, WORLD)

    def rank_branch(self, call: CallInfo) -> Branch | None:
        """The outermost enclosing `if` whose test depends on the rank, with the arm."""
        for branch in call.branches:
            node = branch[0]
            known = self._rank_tests.get(id(node))
            if known is None:
                known = self._rank_tests[id(node)] = self.rank_dependent(node.test)
            if known:
                return branch
        return None

    # -- file-level facts ------------------------------------------------------------
    @property
    def data_parallel(self) -> bool:
        return "data_parallel" in self.facts

    def is_collective(self, call: CallInfo) -> bool:
        if call.name in COLLECTIVES and (
            call.under("torch.distributed", "mindspore")
            or call.qual is None
            and call.dotted
            and call.dotted.split(".")[0] in ("dist", "comm")
        ):
            return True
        # `allreduce = ops.AllReduce()` ... `allreduce(x)`
        if isinstance(call.node.func, ast.Name | ast.Attribute) and call.qual is None:
            for value in self.bound_values(call.node.func):
                inner = self.call_of(value)
                if (
                    inner is not None
                    and inner is not call
                    and inner.name in MS_COLLECTIVE_OPS
                    and inner.under("mindspore")
                ):
                    return True
        return False

    @property
    def dp_anchor(self) -> CallInfo | None:
        """The first call that makes this file data-parallel."""
        return next((c for c in self.calls if _is_dp_marker(c)), None)

    def chain(self, expr: ast.AST | None, before: int, depth: int = 0) -> Iterator[CallInfo]:
        """The calls a value went through: `d.shuffle(1).shard(2)` yields shard, shuffle;
        a name is followed to what it was assigned before line `before`."""
        while isinstance(expr, ast.Call):
            info = self.call_of(expr)
            if info is not None:
                yield info
            f = expr.func
            expr = f.value if isinstance(f, ast.Attribute) else (expr.args[0] if expr.args else None)
        key = dotted_name(expr) if expr is not None else None
        if key is None or depth > 4:
            return
        for a in self._assigns_to(key):
            if a.value is not None and a.target.lineno < before and a.value is not expr:
                yield from self.chain(a.value, a.target.lineno, depth + 1)

    def _file_facts(self) -> set[str]:
        facts: set[str] = set()
        for c in self.calls:
            if c.name in _FACT_CALLS:
                facts.add(_FACT_CALLS[c.name])
            if c.name in ("DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP") or c.qual in (
                "deepspeed.initialize",
                "accelerate.Accelerator",
            ):
                facts.add("ddp")
            if (
                c.kw("loss_scale_manager") is not None
                or (c.name == "Accelerator" and c.kw("mixed_precision") is not None)
                or c.qual in ("deepspeed.initialize", "apex.amp.initialize")
            ):
                facts.add("loss_scale")
            if c.name == "set_auto_parallel_context":
                mean = c.kw("gradients_mean")
                if mean is not None and literal(mean.value) is not False:
                    facts.add("gradients_mean")
            if _is_dp_marker(c):
                facts.add("data_parallel")
            if c.name in ("parameters", "trainable_params", "DistributedDataParallel", "DDP") or (
                c.under("torch.nn", "mindspore.nn") and c.name[:1].isupper()
            ):
                facts.add("model")
            facts.update(_seed_facts(c))
        return facts


# Calls whose mere presence somewhere in the job settles a question.
_FACT_CALLS = {
    "set_epoch": "set_epoch",
    "set_train": "set_train",
    "no_sync": "no_sync",
    "accumulate": "no_sync",  # accelerate's accumulate() skips the sync itself
    "backward": "backward",
    "value_and_grad": "custom_loop",
    "GradOperation": "custom_loop",
    "Model": "ms_model",
    **dict.fromkeys(
        (
            "GradScaler",
            "ShardedGradScaler",
            "DynamicLossScaleManager",
            "FixedLossScaleManager",
            "DynamicLossScaler",
            "StaticLossScaler",
            "DynamicLossScaleUpdateCell",
            "FixedLossScaleUpdateCell",
            "TrainOneStepWithLossScaleCell",
            "all_finite",
        ),
        "loss_scale",
    ),
}


def _is_dp_marker(c: CallInfo) -> bool:
    return (
        c.name in _DP_NAMES
        or c.qual
        in (
            "mindspore.communication.init",
            "mindspore.communication.management.init",
            "deepspeed.initialize",
            "accelerate.Accelerator",
        )
        or (c.name == "shard" and bool(c.node.args or c.node.keywords))
        or c.kw("num_shards") is not None
        or (c.name in COLLECTIVES and c.under("torch.distributed"))
    )


def is_shard_point(c: CallInfo) -> bool:
    """A call after which each rank holds only its own part of the data: `.shard(...)`,
    or a source read with num_shards/shard_id and its own shuffle switched off."""
    if c.name == "shard" and (c.node.args or c.node.keywords):
        return True
    shuffle = c.kw("shuffle")
    return c.kw("num_shards") is not None and shuffle is not None and literal(shuffle.value) is False


_OPTIMIZERS = frozenset(
    {
        "SGD",
        "Adam",
        "AdamW",
        "RMSprop",
        "RMSProp",
        "Adagrad",
        "Adadelta",
        "Adamax",
        "NAdam",
        "RAdam",
        "LBFGS",
        "Momentum",
        "Lamb",
        "LAMB",
        "LARS",
        "AdamWeightDecay",
        "Adafactor",
        "FTRL",
        "ProximalAdagrad",
        "Rprop",
        "ASGD",
        "SparseAdam",
        "Lion",
    }
)


def is_optimizer_ctor(c: CallInfo) -> bool:
    if c.under("torch.optim.lr_scheduler") or c.name.startswith(("get_", "create_")):
        return False
    return c.name in _OPTIMIZERS or c.name.endswith("Optimizer") or (c.under("torch.optim") and c.name[:1].isupper())


def is_loss_ctor(c: CallInfo) -> bool:
    return c.name[:1].isupper() and c.name.endswith(("Loss", "WithLogits", "Criterion"))


_STEPPERS = ("optim", "opt", "sched", "scaler")


def is_optimizer_step(ctx: ScriptContext, c: CallInfo) -> bool:
    """`optimizer.step()`, `scaler.step(opt)`, `scheduler.step()`, `train_net(x)` of a
    MindSpore TrainOneStepCell, or calling a MindSpore optimizer on gradients."""
    if c.name == "step":
        name = (terminal_name(c.receiver) or "").lower()
        return name.startswith(_STEPPERS) or "optim" in name or "sched" in name
    if c.qual is None and isinstance(c.node.func, ast.Name):
        for value in ctx.bound_values(c.node.func):
            inner = ctx.call_of(value)
            if (
                inner is not None
                and inner is not c
                and (inner.name.startswith("TrainOneStep") or is_optimizer_ctor(inner))
            ):
                return True
    return False


def accumulation_guard(ctx: ScriptContext, c: CallInfo) -> ast.If | None:
    """The `if ... % N ...:` an optimizer step sits in: gradient accumulation."""
    for node, arm in reversed(getattr(c, "branches", ())):
        if arm == "body" and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for n in ast.walk(node.test)):
            return node
    return None


def _asks_distributed(cmp: ast.Compare) -> bool:
    """`local_rank != -1`, `rank is None`, `local_rank >= 0`: the same answer on every rank."""
    values = [literal(c) for c in cmp.comparators]
    if all(v in (-1, None) and v is not NOT_LITERAL and not isinstance(v, bool) for v in values):
        return True
    return len(cmp.ops) == 1 and values == [0] and isinstance(cmp.ops[0], ast.GtE | ast.Lt)


def _seed_facts(c: CallInfo) -> set[str]:
    """Which random sources a call seeds."""
    q = c.qual or ""
    lname = c.name.lower()
    if "seed" not in lname:
        return set()
    if q in ("random.seed",):
        return {"seed:python"}
    if q in ("numpy.random.seed",):
        return {"seed:numpy"}
    if q.startswith("torch") and "manual_seed" in lname:
        return {"seed:torch"}
    if q.startswith("mindspore.dataset"):
        return {"seed:dataset"}
    if q.startswith("mindspore"):
        return {"seed:mindspore", "seed:numpy"}  # mindspore.set_seed seeds numpy too
    if q.startswith(("numpy", "random", "torch")) or lname in ("initial_seed", "get_seed"):
        return set()  # RandomState(seed=...), torch.initial_seed(): not a global seed
    # set_seed / seed_everything / setup_seed / init_seeds of transformers, lightning,
    # accelerate or the user's own helper: they seed every library the job uses.
    return {"seed:all"}
