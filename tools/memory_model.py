#!/usr/bin/env python3
"""Bytes per GPU of a onebit worker: the memory model of docs/performance.md, "Memory".

    tools/memory_model.py --params 7e9 --local_size 8 --nodes 8 --shard_state true
    tools/memory_model.py --params 7e9 --shard_state true --param_dtype bf16 --grad_dtype bf16
    tools/memory_model.py --table                  # 1B, 7B, 13B on nodes of 8 x 80 GiB
    tools/memory_model.py --cpu_job --params 16777216 --local_size 4 --nodes 2 \
        --freeze_step 5 --steps 30 --workload builtin --json   # tools/bench_memory.sh

The model lists every buffer whose size grows with the parameter count n, one row each,
with the code that allocates it (a file and a symbol, not a line). It covers the
hierarchical exchange (exchange.mode hierarchical, inter peer) of a worker on a node of L
workers, with K nodes. Its slices hold S elements: the smallest multiple of K * lcm(K, 8)
>= ceil(n / L) (compression/layout.cc, HierarchicalLayout::Create).

Every row is the code of today: shard_state false and true, with fp32, bf16 or fp16
parameters, an fp32 gradient buffer, and with shard_state and bf16 parameters the bf16
gradient buffer the .grad tensors view (python/embedded.cc picks it where nothing writes
the gradient in float32: no accumulation, no fp16 loss scaling, no overlap buckets). A row
marked DESIGN would be a plan, not code; none is at present.

A worker goes through phases (PHASES): join (Worker() takes the model's parameters), init
(the end of Trainer::Init, before bind makes the tensors views of the worker's buffers),
warmup, compression, end (python/embedded.cc after_run copies the final parameters and state
to the host while every buffer lives) and unbind (the package copies the final parameters
into the tensors, the worker's buffers freed). Each row lives in some of them. --json gives
each phase at its peak: a CPU worker's RAM (both memories) and a GPU worker's device and
host memory apart. A CPU job's peak (--cpu_job) is its largest phase. --table counts the
compression stage's device memory: training, not startup.

Not counted: activations, the CUDA context, NCCL's and gloo's own buffers, the allocator's
slack, and anything of O(1) bytes. Those depend on the model, the batch and the machine.

Closed forms (large n, S = n/L, b = the codec's bytes per element: 1/8 onebit, 1 int8,
33/32 fp8; OneBitAdam, compression stage, no clip, no mask, fp32 gradient buffer; plus the
reduce-scatter's 2 x L x min(S, 4 Mi) floats, O(1) in n):

    shard_state false, fp32 parameters:   20 + b + (20 + 3b)/L + (8 + b)/(L K)
    shard_state true, fp32 parameters:     8 + (28 + 3b)/L + (8 + b)/(L K)
    shard_state true, bf16 p, fp32 grads:  8 + (32 + 3b)/L + (8 + b)/(L K)
    shard_state true, bf16 p + bf16 grads: 4 + (32 + 3b)/L + (8 + b)/(L K)

Peers (bytes per parameter per GPU, Nd = GPUs in the data-parallel group):

    DDP + Adam (fp32 p, g, m, v):              16     (+4: DDP's bucket copy, its default)
    ZeRO-1, mixed precision:                   2 + 2 + 12/Nd   (the ZeRO paper, K = 12)
    DeepSpeed 1-bit Adam (fp16, FP16_Optimizer): 24 + 4/Nd at its step, read from its code
"""
import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field

GIB = 2 ** 30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
OPTIMIZERS = ("onebit_adam", "adam", "zero_one_adam", "onebit_lamb")
CODECS = ("onebit", "int8", "fp8")
STAGES = ("warmup", "compression")
WORKLOADS = ("pytorch", "builtin")
# The intra-node reduce-scatter's segment (HierarchicalOptions::segment_elements in
# worker/exchange/hierarchical_exchange.h; memory_model_test.py reads it there).
SEGMENT_ELEMENTS = 1 << 22

# Where each buffer is allocated: (file, symbol, a regex of the allocating line[, a regex
# of a line it follows]). Rows name the file and the symbol, which survive edits that move
# lines; --check_refs and memory_model_test.py check that the regex still matches, and
# print the line it is on today.
REFS = {
    "p": ("worker/optim/optimizer_base.h", "OptimizerBase::InitCommon, p_",
          r"\(p_, Buffer<float>::Create\(backend_, params_alloc_\)"),
    "p_master": ("worker/optim/optimizer_base.h", "OptimizerBase::InitCommon, p_ (low_)",
                 r"\(p_, Buffer<float>::Create\(backend_, state_alloc_\)"),
    "p_low": ("worker/optim/optimizer_base.h", "OptimizerBase::InitCommon, p_low_",
              r"\(p_low_, Buffer<uint16_t>::Create\(backend_, params_alloc_\)"),
    "p_low_host": ("worker/optim/optimizer_base.h", "OptimizerBase::InitCommon, low",
                   r"std::vector<uint16_t> low\(params_alloc_, 0\)"),
    "mv": ("worker/optim/optimizer_base.h", "OptimizerBase::InitCommon, m_ and v_",
           r"for \(Buffer<float>\* b : \{&m_, &v_\}\)"),
    "zero_one_more": ("worker/optim/zero_one_adam.cc", "ZeroOneAdam::Init",
                      r'"accumulator", &acc_'),
    "lamb_more": ("worker/optim/onebit_lamb.cc", "OnebitLamb::Init",
                  r'"exp_avg_sq_fresh", &v_fresh_'),
    "clip": ("worker/optim/gradient_clipper.cc", "GradientClipper::Create, clipped_",
             r"c\.clipped_, kernels::Buffer<float>::Create"),
    "clip_scale": ("worker/optim/onebit_adam.cc", "OnebitAdam::CompressionStep, ClipScale",
                   r"clip_\.ClipScale\(local_grad\)"),
    "user_mask": ("worker/optim/momentum_mask.cc", "MomentumMask::Create, mask_",
                  r"m\.mask_, kernels::Buffer<float>::FromHost"),
    "user_mask_host": ("worker/optim/momentum_mask.cc", "MomentumMask::Create, user_",
                       r"m\.user_ = user;"),
    "optimizer_options": ("worker/optim/optimizer_base.h", "OptimizerBase::options_",
                          r"^\s*Options options_;"),
    "trainer_options": ("worker/trainer.h", "Trainer::options_",
                        r"^\s*TrainerOptions options_;"),
    "seen": ("worker/optim/momentum_mask.cc", "MomentumMask::Create, seen_",
             r"m\.seen_, kernels::Buffer<float>::Create"),
    "auto_mask": ("worker/optim/momentum_mask.cc", "MomentumMask::Fix, mask_",
                  r"\(mask_, kernels::Buffer<float>::Create"),
    "trainer_grad": ("worker/trainer.cc", "Trainer::Init, grad_",
                     r"\(grad_, kernels::Buffer<float>::Create"),
    "external_grad": ("worker/workloads/external_workload.cc", "ExternalWorkload::Create, gradient",
                      r"\(gradient, kernels::Buffer<float>::Create\(backend, n\)"),
    "external_grad16": ("worker/workloads/external_workload.cc",
                        "ExternalWorkload::Create, gradient16",
                        r"\(gradient16, kernels::Buffer<uint16_t>::Create\(backend, n\)"),
    "micro_grad": ("worker/trainer.cc", "Trainer::Init, micro_grad_",
                   r"\(micro_grad_, kernels::Buffer<float>::Create"),
    "initial": ("worker/trainer.cc", "Trainer::Init, initial",
                r"std::vector<float> initial\(n\);"),
    "variance_copies": ("worker/trainer.cc", "Trainer::VarianceChange, v_now_",
                        r"v_now_\.resize\(count\);"),
    # One host copy, made from the caller's array by onebit_worker_new and kept by
    # EmbeddedWorker; each run's ExternalWorkload shares it (the line after the make_shared).
    "embedded_initial": ("python/embedded.cc", "EmbeddedWorker::Start, w.initial",
                         r"w\.initial = initial_;",
                         r"initial_\(std::make_shared<const std::vector<float>>\(std::move\(initial\)\)\)"),
    "torch_current": ("python/onebit/_params.py", "_FlatParams.current",
                      r"return torch\.cat\(\[p\.detach\(\)\.reshape\(-1\)\.to\("),
    "torch_bind": ("python/onebit/_params.py", "_FlatParams.bind, p.data",
                   r"p\.data = (low|flat)\[begin:end\]\.view\(p\.shape\)"),
    "torch_low_params": ("python/onebit/_params.py", "_FlatParams.bind, masters",
                         r"self\.masters\[i\] = flat"),
    "after_run_params": ("python/embedded.cc", "EmbeddedWorker::Start, after_run",
                         r"std::vector<float> params, trainer\.optimizer\(\)\.ParamsToHost\(\)"),
    "params_to_host_low": ("worker/optim/optimizer_base.h", "OptimizerBase::ParamsToHost, low",
                           r"const std::vector<uint16_t> low, p_low_\.SliceToHost\(0, n_\)"),
    "after_run_state": ("python/optimizer_state.cc", "SaveOptimizerState, StateToHost",
                        r"o\.StateToHost\(spec\.name, range\.first, range\.second\)"),
    "after_run_errors": ("python/optimizer_state.cc", "SaveOptimizerState, SaveErrors",
                         r"state\.errors, o\.exchange\(\)\.SaveErrors\(\)"),
    "final_params_tensor": ("python/onebit/_native.py", "Worker.final_params, out",
                            r"out = torch\.empty\(self\._size, dtype=torch\.float32\)"),
    "torch_unbind": ("python/onebit/_params.py", "_FlatParams.unbind, p.data",
                     r"p\.data = value\.clone\(\) if p\.dtype == value\.dtype"),
    "torch_low_grads": ("python/onebit/_params.py", "_FlatParams.grad_into_view",
                        r"view\.copy_\(p\.grad\.reshape"),
    "segments": ("worker/exchange/hierarchical_exchange.cc",
                 "HierarchicalExchange::Init, send_ and received_",
                 r"\(send_, Buffer<float>::Create"),
    "slice_sum": ("worker/exchange/hierarchical_exchange.cc", "HierarchicalExchange::Init, slice_sum_",
                  r"\(slice_sum_, Buffer<float>::Create"),
    "stage": ("worker/exchange/hierarchical_exchange.cc", "HierarchicalExchange::Init, stage_",
              r"\(stage_, Buffer<float>::Create"),
    "gathered": ("worker/exchange/hierarchical_exchange.cc", "HierarchicalExchange::Init, gathered_",
                 r"\(gathered_, Buffer<float>::Create"),
    "slice_m": ("worker/exchange/hierarchical_exchange.cc", "HierarchicalExchange::Init, slice_m_",
                r"\(slice_m_, Buffer<float>::Create"),
    "blocks": ("worker/exchange/hierarchical_exchange.cc", "HierarchicalExchange::Init, blocks_",
               r"\(blocks_, Buffer<uint8_t>::Create"),
    "lamb_rows": ("worker/exchange/hierarchical_exchange.cc", "HierarchicalExchange::ShardRows, rows_",
                  r"\(rows_, kernels::Buffer<float>::Create"),
    "inter_rows": ("worker/exchange/exact_allreduce.cc", "ExactAllreduce::Create, rows_",
                   r"a->rows_, Buffer<uint8_t>::Create"),
    "inter_summed": ("worker/exchange/exact_allreduce.cc", "ExactAllreduce::Create, summed_",
                     r"a->summed_, Buffer<float>::Create"),
    "inter_gathered": ("worker/exchange/exact_allreduce.cc", "ExactAllreduce::Create, gathered_",
                       r"a->gathered_, Buffer<uint8_t>::Create", r"a->summed_, Buffer<float>"),
    "worker_error": ("compression/worker_compressor.cc", "WorkerCompressor::Create, the error",
                     r"Buffer<float>::Create\(backend, num_chunks \* chunk\)"),
    "server_error": ("compression/chunk_aggregator.cc", "ChunkAggregator::Create, the error",
                     r"Buffer<float>::Create\(backend, chunk\)"),
    "inter_blocks": ("worker/exchange/compressed_allreduce.cc",
                     "CompressedAllreduce::Init, send_ and the block buffers",
                     r"send_, kernels::Buffer<uint8_t>::Create"),
}


def block_bytes(codec, chunk):
    """Bytes of one compressed block of `chunk` elements."""
    if codec == "onebit":
        return 4 + chunk // 8          # kernels/kernels.h CompressedBlockBytes
    if codec == "int8":
        return 8 + chunk               # kernels/kernels.h Int8BlockBytes
    if codec == "fp8":
        return -(-chunk // 32) + chunk  # compression/fp8/fp8_e4m3.h BlockBytes
    raise ValueError(f"codec {codec!r}: one of {', '.join(CODECS)}")


def peer_padded_size(n, w):
    """compression/layout.cc PeerPaddedSize: n rounded up to a multiple of w * lcm(w, 8)."""
    multiple = w * math.lcm(w, 8)
    return -(-n // multiple) * multiple


def slice_size(n, local_size, nodes):
    """HierarchicalLayout's S: the elements of one local rank's slice."""
    return peer_padded_size(-(-n // local_size), nodes)


@dataclass
class Config:
    params: int
    local_size: int = 8
    nodes: int = 8
    optimizer: str = "onebit_adam"
    codec: str = "onebit"
    param_dtype: str = "fp32"
    grad_dtype: str = "fp32"
    shard_state: bool = False
    clip: bool = False
    user_mask: bool = False
    auto_mask: bool = False
    accumulation: bool = False
    stage: str = "compression"
    workload: str = "pytorch"
    # Only for the host copies of the variance change (trainer.cc VarianceChange) and a CPU
    # job's peak: the last warmup step, the job's steps, the freeze report interval.
    freeze_step: int = 100000
    steps: int = 10 ** 9
    report_interval: int = 10

    def check(self):
        bad = []
        if self.params < 1:
            bad.append("params must be >= 1")
        if self.local_size < 1 or self.nodes < 1:
            bad.append("local_size and nodes must be >= 1")
        for name, value, allowed in (("optimizer", self.optimizer, OPTIMIZERS),
                                     ("codec", self.codec, CODECS),
                                     ("param_dtype", self.param_dtype, DTYPE_BYTES),
                                     ("grad_dtype", self.grad_dtype, DTYPE_BYTES),
                                     ("stage", self.stage, STAGES),
                                     ("workload", self.workload, WORKLOADS)):
            if value not in allowed:
                bad.append(f"{name} {value!r}: one of {', '.join(allowed)}")
        if bad:
            raise ValueError("; ".join(bad))
        if self.optimizer == "adam" and self.stage == "compression":
            raise ValueError("adam never leaves the warmup stage (OnebitAdam that never "
                             "freezes, optimizer_factory.cc): use --stage warmup")
        if self.param_dtype != "fp32" and self.workload != "pytorch":
            raise ValueError("bf16/fp16 parameters come from a PyTorch model (workload "
                             "pytorch); the built-in workloads are fp32")
        if self.shard_state and self.local_size < 2:
            raise ValueError("shard_state needs local_size >= 2 (the job config refuses less)")
        if self.shard_state and self.optimizer == "zero_one_adam":
            raise ValueError("shard_state with zero_one_adam is refused (ZeroOneAdam's "
                             "kCannotShard): its local steps keep each worker's own p and m")
        if self.grad_dtype != "fp32":
            if self.grad_dtype != "bf16":
                raise ValueError("an fp16 model's gradient buffer is fp32 (fp16's loss "
                                 "scaling unscales it in place)")
            if not self.shard_state:
                raise ValueError("a bf16 gradient buffer comes with shard_state true (the "
                                 "unsharded exchange reads fp32 gradients)")
            if self.grad_dtype != self.param_dtype:
                raise ValueError("a low-precision gradient buffer is the parameters' .grad: "
                                 "grad_dtype must equal param_dtype")
            if self.accumulation:
                raise ValueError("a bf16 gradient buffer takes no accumulation (the trainer "
                                 "sums micro-batches in fp32; python/embedded.cc keeps it "
                                 "fp32 then)")

    @property
    def last_warmup_step(self):
        return self.steps if self.optimizer == "adam" else min(self.freeze_step, self.steps)


# A worker's phases, in order. join: Worker() takes the model's parameters (before the
# worker's thread starts); init: Trainer::Init, at its end (the tensors not yet bound);
# warmup, compression: the steps; end: after_run (python/embedded.cc) copies the final
# parameters and state to the host while every buffer lives; unbind: after the worker's
# buffers are freed, the package gives the tensors memory of their own again.
PHASES = ("join", "init", "warmup", "compression", "end", "unbind")
# The phases a row's `when` puts it in (Buffer.also adds more).
ALIVE = {
    "job": ("init", "warmup", "compression", "end"),  # Trainer::Init to the worker's end
    "steps": ("warmup", "compression", "end"),        # from the first backward on
    "join": ("join",), "init": ("init",), "warmup": ("warmup",),
    "compression": ("compression",), "end": ("end",), "unbind": ("unbind",),
}
# What InitCommon and Trainer::Init allocate after InitCommon frees its host cast `low`
# (p_low_host): at that moment these do not exist yet, so on a CPU the cast adds only what
# exceeds them.
MADE_AFTER_LOW_HOST = ("mv", "lamb_more", "user_mask", "seen", "trainer_grad", "micro_grad")


@dataclass
class Buffer:
    name: str
    ref: str           # a key of REFS: the code that allocates it
    nbytes: int
    memory: str = "device"   # device (GPU memory on GPUs, RAM on CPUs) or host
    when: str = "job"        # a key of ALIVE
    design: bool = False     # not code yet (the note says whose design)
    note: str = ""
    also: tuple = ()         # phases it is alive in besides its `when`'s
    # In its `when` phase, alive only at this moment: rows of one moment live together,
    # rows of two moments never (in its `also` phases it lives throughout).
    moment: str = ""

    def phases(self):
        return ALIVE[self.when] + self.also


def buffers(c):
    """Every buffer of one worker that grows with n, as Buffer rows."""
    c.check()
    n, L, K = c.params, c.local_size, c.nodes
    S = slice_size(n, L, K)
    padded = L * S
    chunk = S // K
    bb = block_bytes(c.codec, chunk)
    pb, gb = DTYPE_BYTES[c.param_dtype], DTYPE_BYTES[c.grad_dtype]
    low = c.param_dtype != "fp32"
    sh = c.shard_state
    lamb = c.optimizer == "onebit_lamb"
    state = S if sh else n  # the elements of m, v and the like
    torch = c.workload == "pytorch"
    # The model's tensors become views of the worker's buffers at bind (fp32, or sharded
    # low precision); an unsharded bf16/fp16 model keeps its own beside fp32 masters.
    views = torch and (sh or not low)
    # The stage the job ends in: its rows are alive at the worker's end too.
    last = "compression" if c.optimizer != "adam" and c.steps > c.freeze_step else "warmup"

    def at_end(stage):
        return ("end",) if stage == last else ()
    rows = []

    def add(name, ref, nbytes, design=False, **kw):
        rows.append(Buffer(name, ref, int(nbytes), design=design, **kw))

    # Parameters.
    if not sh:
        add("p" + (" (fp32 master; the model keeps its own)" if low else ""), "p", 4 * n)
        if low:
            add(f"model parameters, {c.param_dtype} (torch's own tensors)", "torch_low_params",
                pb * n, also=("join", "unbind"))
    elif not low:
        add("p, whole and padded to L x S (every worker's model reads it)", "p", 4 * padded)
    else:
        add("p: fp32 master of the slice", "p_master", 4 * S)
        add(f"p_low_: the model's {c.param_dtype} parameters, padded (the model views them)",
            "p_low", pb * padded)
    # Optimizer state.
    add("m (exp_avg)", "mv", 4 * state)
    add("v (exp_avg_sq)", "mv", 4 * state)
    if c.optimizer == "zero_one_adam":
        add("0/1 Adam: accumulator, avg (scratch), anchor", "zero_one_more", 12 * n)
    if lamb:
        add("1-bit LAMB: exp_avg_sq_fresh, m_last (scratch), u (scratch)", "lamb_more",
            12 * state)
    if c.clip:
        if not sh:
            add("clip copy clipped_", "clip", 4 * n)
        else:  # 1-bit Adam's segments and 1-bit LAMB's rows take the clip's scale
            add("clip copy: none, the exchange scales each segment it sends", "clip_scale", 0)
    if c.user_mask:
        add("user momentum mask", "user_mask", 4 * state)
        add("user mask, host copy in MomentumMask", "user_mask_host", 4 * state, memory="host")
        add("user mask, host copy in the optimizer's options", "optimizer_options", 4 * n,
            memory="host")
        add("user mask, host copy in the trainer's options", "trainer_options", 4 * n,
            memory="host")
    if c.auto_mask:
        add("automatic mask: nonzero_seen", "seen", 4 * state)
        if not c.user_mask:
            add("automatic mask: mask_ (made at the first compression step)", "auto_mask",
                4 * state, when="compression", also=at_end("compression"))
    # Gradients.
    if c.workload == "builtin":
        add("gradient: the trainer's grad_", "trainer_grad", 4 * n)
    else:
        add(f"gradient buffer, {c.grad_dtype} ("
            + ("backward's own .grad is cast into it" if low and gb == 4
               else "the .grad tensors view it") + ")",
            "external_grad" if gb == 4 else "external_grad16", gb * n)
        if low and gb == 4:
            add(f"model gradients, {c.param_dtype} (backward's own .grad, cast in; made by "
                "the first backward)", "torch_low_grads", pb * n, when="steps", also=("unbind",))
        if c.accumulation:
            add("gradient: the trainer's grad_ (accumulation)", "trainer_grad", 4 * n)
    if c.accumulation:
        add("gradient accumulation: micro_grad_", "micro_grad", 4 * n)
    # The hierarchical exchange.
    add("hierarchical: send_, received_ (the reduce-scatter's L rows of one segment, twice)",
        "segments", 2 * 4 * L * min(S, SEGMENT_ELEMENTS))
    add("hierarchical: slice_sum_", "slice_sum", 4 * S)
    if not sh:
        add("hierarchical: gathered_ (the whole result)", "gathered", 4 * padded)
        add("hierarchical: slice_m_", "slice_m", 4 * S)
        if K > 1:
            add("hierarchical: blocks_ (every slice's K blocks)", "blocks", L * K * bb)
    else:
        # A slice of floats, also for low-precision parameters (AllGatherShardBytes stages
        # their 2-byte slice in it; the one-node momentum uses it as floats).
        add("hierarchical: stage_ (the all-gather's copy of the updated slice)", "stage",
            4 * S)
        if lamb:
            add("hierarchical: rows_ (ShardRows: slice l of every local worker's gradient, "
                "L x S, made at the first compression step)", "lamb_rows", 4 * padded,
                when="compression", also=at_end("compression"))
    if K > 1:
        # The inter-node PeerExchange over the slice (hierarchical_exchange.cc CreatePeer).
        add("inter ExactAllreduce: rows_", "inter_rows", 4 * K * chunk)
        add("inter ExactAllreduce: summed_", "inter_summed", 4 * chunk)
        add("inter ExactAllreduce: gathered_", "inter_gathered", 4 * S)
        add("inter worker error", "worker_error", 4 * S)
        add("inter server error", "server_error", 4 * chunk)
        add("inter CompressedAllreduce: send_, received_, gathered_, server_out_",
            "inter_blocks", (3 * K + 1) * bb)
    # Host memory outside the backend.
    add("initial parameters (Trainer::Init, freed when it returns)", "initial", 4 * n,
        memory="host", when="init")
    if sh and low:
        add(f"the initial parameters cast to {c.param_dtype} (InitCommon's `low`, freed before "
            "m and v are made: on a CPU it adds only what exceeds them)", "p_low_host",
            pb * padded, memory="host", when="init", moment="InitCommon")
    if c.report_interval > 0 and c.last_warmup_step >= c.report_interval:
        add("variance-change copies v_prev_, v_now_ (freed at the switch)", "variance_copies",
            8 * state, memory="host", when="warmup", also=at_end("warmup"))
    if torch:
        add("initial parameters: one fp32 copy (onebit_worker_new's), kept by EmbeddedWorker "
            "and shared with each run's ExternalWorkload", "embedded_initial", 4 * n,
            memory="host", also=("join", "unbind"))
        add("current()'s fp32 copy handed to Worker() (dropped before start(); a bf16 or GPU "
            "model's per-tensor casts take as much just before, when the shared copy does "
            "not exist yet)", "torch_current", 4 * n, memory="host", when="join")
        if views:
            add(f"the model's own {c.param_dtype} parameters until bind makes them views of the "
                "worker's buffer (device memory on a GPU; torch's caching allocator keeps the "
                "freed blocks)", "torch_bind", pb * n, when="init", also=("join",))
        add_end_copies(c, add, n, S, chunk, state, low and sh, pb, views)
    return rows


def checkpoint_tensors(c):
    """The tensors SaveOptimizerState copies at the worker's end: CheckpointStates (the
    optimizer's TensorStates, then the automatic mask's nonzero_seen), each over the state
    range."""
    count = {"onebit_adam": 3, "adam": 3, "onebit_lamb": 4}.get(c.optimizer)
    if count is None:  # 0/1 Adam: params, exp_avg, exp_avg_sq; after its variance stage
        count = 5 if c.steps > c.freeze_step else 3  # also accumulator and anchor
    return count + (1 if c.auto_mask else 0)


def add_end_copies(c, add, n, S, chunk, state, low_sharded, pb, views):
    """A PyTorch worker's end (python/embedded.cc after_run, then the package's unbind)."""
    add("after_run: the final parameters, fp32 (ParamsToHost into final_params_)",
        "after_run_params", 4 * n, memory="host", when="end", also=("unbind",))
    if low_sharded:
        add(f"after_run: ParamsToHost's {c.param_dtype} copy of p_low_ (freed once widened, "
            "before the state is copied)", "params_to_host_low", pb * n, memory="host",
            when="end", moment="ParamsToHost")
    add(f"after_run: SaveOptimizerState's copies of {checkpoint_tensors(c)} state tensors "
        "over the state range (final_state_)", "after_run_state",
        4 * state * checkpoint_tensors(c), memory="host", when="end",
        moment="SaveOptimizerState", also=("unbind",))
    if c.nodes > 1:
        add("after_run: SaveErrors' copies of the inter worker and server errors (final_state_)",
            "after_run_errors", 4 * (S + chunk), memory="host", when="end",
            moment="SaveOptimizerState", also=("unbind",))
    add("unbind: final_params()'s fp32 tensor, which FinalParams fills from final_params_ "
        "(on a GPU then copied to the device)",
        "final_params_tensor", 4 * n, memory="host", when="unbind")
    if views:
        add(f"unbind: the model's own {c.param_dtype} parameters again (device memory on a "
            "GPU)", "torch_unbind", pb * n, when="unbind", moment="clone")


def live(rows, memory, stage):
    """Rows of `memory` alive throughout `stage` (job-long and that stage's own)."""
    return [r for r in rows if r.memory == memory and stage in r.phases()
            and not (r.moment and r.when == stage)]


def phase_total(rows, phase, memories=("device", "host")):
    """The bytes of `memories` alive at the peak of `phase`: what lives throughout it, plus
    its largest moment. A CPU worker's RAM is both memories; on a GPU, each alone."""
    here = [r for r in rows if phase in r.phases() and r.memory in memories]
    steady = [r for r in here if not (r.moment and r.when == phase)]
    peaks = [0]
    for moment in sorted({r.moment for r in here if r not in steady}):
        extra = total(r for r in here if r.moment == moment and r not in steady)
        if moment == "InitCommon":  # freed before these exist
            extra -= total(r for r in steady if r.ref in MADE_AFTER_LOW_HOST)
        peaks.append(extra)
    return total(steady) + max(peaks)


def job_phases(c):
    """The phases a worker of config `c` goes through."""
    out = ["join", "init"] if c.workload == "pytorch" else ["init"]
    if c.last_warmup_step >= 1:
        out.append("warmup")
    if c.optimizer != "adam" and c.steps > c.freeze_step:
        out.append("compression")
    if c.workload == "pytorch":
        out += ["end", "unbind"]
    return out


def phase_bytes(c, memories=("device", "host")):
    """{phase: bytes at its peak} for the phases of `c`'s job."""
    rows = buffers(c)
    return {ph: phase_total(rows, ph, memories) for ph in job_phases(c)}


def total(rows):
    return sum(r.nbytes for r in rows)


def per_gpu_bytes(c):
    """Device bytes of one worker in c.stage."""
    return total(live(buffers(c), "device", c.stage))


def cpu_job_peak_bytes(c):
    """A CPU worker's peak RSS above its fixed part: every row is RAM, and the peak is the
    largest of its phases (phase_bytes)."""
    return max(phase_bytes(c).values())


# ---- The peers ----

def peer_rows(gpus):
    """(setup, bytes per parameter, where the figure comes from) for Nd = gpus."""
    return [
        ("DDP + Adam (fp32 p, g, m, v)", 16.0,
         "p 4 + g 4 + m 4 + v 4. DDP's gradient buckets add 4 more unless "
         "gradient_as_bucket_view=True (off by default). bf16 p, g with fp32 master, m, v "
         "is also 2 + 2 + 12 = 16"),
        ("ZeRO-1, mixed precision", 4.0 + 12.0 / gpus,
         "the ZeRO paper (Rajbhandari et al., SC'20), section 5.1: 2 + 2 + K/Nd with K = 12 "
         "(fp32 master, m, v sharded over all Nd GPUs)"),
        ("DeepSpeed 1-bit Adam (fp16, FP16_Optimizer)", 24.0 + 4.0 / gpus,
         "read from DeepSpeed's code: fp16 p 2, fp16 grads 2 (until flattened), fp32 flat "
         "grads 4 (fused_optimizer.py step), fp32 master 4, m, v 8, worker_error 4, "
         "server_error 4/Nd (fp16/onebit/adam.py). compressed_allreduce (runtime/comm/nccl.py) "
         "adds about 8 more of temporaries at its peak, 12 when the tensor needs padding"),
    ]


# ---- Code references ----

def repo_root():
    """The checkout this file is in (through Bazel's runfiles links), or None."""
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    probe = os.path.join(here, REFS["segments"][0])
    return here if os.path.isfile(probe) else None


def locate(root):
    """{ref: 'path:line'} for every REFS entry found today; raises LookupError naming the
    missing. The rows themselves name path and symbol (where()), not the line."""
    found, missing = {}, []
    for key, spec in REFS.items():
        path, symbol, pattern = spec[0], spec[1], spec[2]
        after = spec[3] if len(spec) > 3 else None
        try:
            with open(os.path.join(root, path), encoding="utf-8") as f:
                text = f.read()
        except OSError:
            missing.append(f"{key}: {path} is missing")
            continue
        lines = text.splitlines()
        owner = re.split(r"::|\.", symbol.split(",")[0])[-1].strip()
        if not re.search(r"\b" + re.escape(owner) + r"\b", text):
            missing.append(f"{key}: {path} has no {owner} (symbol {symbol!r})")
            continue
        start = 0
        if after is not None:
            start = next((i + 1 for i, line in enumerate(lines) if re.search(after, line)), None)
            if start is None:
                missing.append(f"{key}: no line of {path} matches {after!r}")
                continue
        line = next((i + 1 for i in range(start, len(lines)) if re.search(pattern, lines[i])),
                    None)
        if line is None:
            missing.append(f"{key}: no line of {path} matches {pattern!r}")
        else:
            found[key] = f"{path}:{line}"
    if missing:
        raise LookupError("the model names code that is not there any more (update REFS and "
                          "the rows): " + "; ".join(missing))
    return found


def where(row):
    """The file and symbol that allocate `row`'s buffer (no line number: lines move)."""
    path, symbol = REFS[row.ref][0], REFS[row.ref][1]
    at = f"{path} ({symbol})"
    if row.design:
        return f"DESIGN ({row.note or 'plan'}); code today: {at}"
    return at


# ---- Output ----

def fmt_gib(nbytes):
    return f"{nbytes / GIB:.1f}"


def describe(c):
    return (f"{c.optimizer}, {c.codec} codec, {c.param_dtype} parameters, {c.grad_dtype} "
            f"gradient buffer, shard_state {'true' if c.shard_state else 'false'}, "
            f"{c.stage} stage, L = {c.local_size} workers per node, {c.nodes} nodes, "
            f"workload {c.workload}"
            + "".join(f", {flag}" for flag in ("clip", "user_mask", "auto_mask", "accumulation")
                      if getattr(c, flag)))


def report(c):
    rows = buffers(c)
    n = c.params
    out = [f"{n:,} parameters: {describe(c)}", "",
           "| buffer | allocated by | memory | lives | B/param | GiB |",
           "|---|---|---|---|---:|---:|"]
    for r in rows:
        lives = ", ".join(p for p in PHASES if p in r.phases())
        if r.moment:
            lives += f" (in {r.when}: {r.moment} only)"
        out.append(f"| {r.name} | {where(r)} | {r.memory} | {lives} | "
                   f"{r.nbytes / n:.3f} | {fmt_gib(r.nbytes)} |")
    dev = total(live(rows, "device", c.stage))
    host = total(live(rows, "host", c.stage))
    out += ["",
            f"device (GPU) memory in the {c.stage} stage: {dev / n:.2f} B/param, "
            f"{fmt_gib(dev)} GiB per GPU",
            f"host memory besides (same stage): {host / n:.2f} B/param, {fmt_gib(host)} GiB "
            "per process",
            "", "| phase | device (GPU) B/param | host B/param | both (a CPU worker's RAM) "
            "B/param |", "|---|---:|---:|---:|"]
    on_dev, on_host, ram = (phase_bytes(c, m) for m in (("device",), ("host",),
                                                        ("device", "host")))
    for ph in ram:
        out.append(f"| {ph} | {on_dev[ph] / n:.2f} | {on_host[ph] / n:.2f} | "
                   f"{ram[ph] / n:.2f} |")
    out += ["", "not counted: activations, the CUDA context, NCCL/gloo buffers, allocator slack"]
    if any(r.design for r in rows):
        out.append("rows marked DESIGN are not code yet")
    return "\n".join(out)


TABLE_SIZES = ((1e9, "1B"), (7e9, "7B"), (13e9, "13B"))


def table_setups(local_size, nodes):
    """The onebit rows of --table: (label, Config without params)."""
    base = dict(local_size=local_size, nodes=nodes, workload="pytorch", stage="compression")
    return [
        ("onebit unsharded, fp32 parameters", dict(base)),
        ("onebit unsharded, bf16 parameters (fp32 masters in onebit)",
         dict(base, param_dtype="bf16")),
        ("onebit sharded, fp32 parameters", dict(base, shard_state=True)),
        ("onebit sharded, bf16 parameters, fp32 gradient buffer",
         dict(base, shard_state=True, param_dtype="bf16")),
        ("onebit sharded, bf16 parameters, bf16 gradient buffer",
         dict(base, shard_state=True, param_dtype="bf16", grad_dtype="bf16")),
    ]


def table(local_size=8, nodes=8, gpu_gib=80.0):
    gpus = local_size * nodes
    head = [
        f"Per GPU, nodes of {local_size} GPUs of {gpu_gib:g} GiB, {nodes} nodes ({gpus} GPUs), "
        "1-bit Adam in its compression stage, 1-bit codec, a PyTorch model, no clipping or "
        "masks. GiB = 2^30 bytes.",
        "",
        "Counted: parameters, gradients, optimizer state and the exchange's buffers. Not "
        "counted: activations, the CUDA context, NCCL buffers, allocator slack. A row "
        "\"fits\" when what it counts is under the GPU's memory; the headroom is what is left "
        "for the rest.",
        "",
        "| setup | B/param | 1B (GiB) | 7B (GiB) | 13B (GiB) | fits (headroom GiB) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    out, notes = list(head), []

    def line(label, per_param, note=None):
        sizes = [per_param * p / GIB for p, _ in TABLE_SIZES]
        fits = [f"{name} ({gpu_gib - s:.0f})" for s, (_, name) in zip(sizes, TABLE_SIZES)
                if s < gpu_gib]
        out.append(f"| {label} | {per_param:.2f} | " + " | ".join(f"{s:.1f}" for s in sizes)
                   + f" | {', '.join(fits) if fits else 'none'} |")
        if note:
            notes.append(f"- {label}: {note}.")

    for label, per_param, source in peer_rows(gpus):
        line(label, per_param, source)
    onebit = []
    for label, kw in table_setups(local_size, nodes):
        per_param = per_gpu_bytes(Config(params=int(7e9), **kw)) / 7e9
        line(label, per_param)
        onebit.append((label, per_param))
    out += ["", "Where the peers' figures come from:"] + notes

    def left(per_param, params):
        return gpu_gib - per_param * params / GIB

    def room(b, params, name):
        gib = left(b, params)
        return f"{name} leaves {gib:.0f} GiB" if gib >= 0 else f"{name} is {-gib:.0f} GiB over"

    verdict = ["", "Every onebit row is the code of today."]
    for k, b in onebit:
        verdict.append(f"{k}: {room(b, 7e9, '7B')}, {room(b, 13e9, '13B')}.")
    roomy = [k for k, b in onebit if left(b, 7e9) >= 16]
    if roomy:
        verdict.append(f"So 7B trains, with its activations under the headroom, only as "
                       f"{'; '.join(roomy)} (the other rows leave under 16 GiB).")
    if all(left(b, 13e9) < 0 for _, b in onebit):
        verdict.append("No onebit row fits 13B.")
    # Startup: device memory at the end of Trainer::Init, before bind and any activation.
    seven = [(label, Config(params=int(7e9), **kw)) for label, kw in
             table_setups(local_size, nodes)]
    start = {label: phase_bytes(c, ("device",))["init"] / 7e9 for label, c in seven}
    own = {label: total(r for r in buffers(c) if r.ref == "torch_bind") / 7e9
           for label, c in seven}
    last_label = onebit[-1][0]
    verdict.append(
        f"The table counts training. Startup briefly holds the model's own parameters beside "
        f"the worker's buffers, until bind makes them views of the worker's, and before any "
        f"activation exists: {own[last_label]:.0f} B/param for bf16 "
        f"({fmt_gib(own[last_label] * 7e9)} GiB at 7B), 4 for fp32. torch's caching allocator "
        f"keeps the freed blocks for the activations.")
    for label, b in onebit:
        if start[label] > b + 1e-9:
            verdict.append(f"{label} at startup: {start[label]:.2f} B/param, "
                           f"{room(start[label], 7e9, '7B')}.")
    # Host memory of one process, by phase (every onebit row is a PyTorch worker).
    host = {label: phase_bytes(c, ("host",)) for label, c in seven}

    def gib(per_param, per_node=False):
        return fmt_gib(per_param * 7e9 * (local_size if per_node else 1))

    train = host[last_label]["compression"] / 7e9
    verdict.append(
        f"Host RAM is apart from this. While it trains, a PyTorch worker keeps one fp32 copy of "
        f"the initial parameters: {train:.0f} B/param, {gib(train)} GiB per process at 7B, "
        f"{gib(train, True)} GiB per node of {local_size}. At startup Trainer::Init's copy adds "
        f"4 (a sharded bf16 model's cast 2 more).")
    groups = {}  # (phase, B/param) at the host peak: the setups with it
    for label, _ in seven:
        ph = max(host[label], key=host[label].get)
        b = host[label][ph] / 7e9
        groups.setdefault((ph, round(b, 2)), (b, []))[1].append(label)
    peaks = []
    for (ph, _), (b, labels) in groups.items():
        kinds = {label.split(",")[0].replace("onebit ", "") for label in labels}
        name = kinds.pop() if len(kinds) == 1 else "; ".join(labels)
        peaks.append(f"{name[0].upper()}{name[1:]}, {b:.2f} B/param in phase {ph}: {gib(b)} "
                     f"GiB per process at 7B, {gib(b, True)} GiB per node.")
    verdict.append("The host peak comes at the worker's end. after_run copies the final "
                   "parameters and state to the host, then final_params() copies the "
                   "parameters once more for the tensors. " + " ".join(peaks))
    out += verdict
    return "\n".join(out)


def parse_bool(text):
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r}: true or false")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=float, help="parameters n (7e9 is fine)")
    ap.add_argument("--local_size", type=int, default=8, help="workers per node, L")
    ap.add_argument("--nodes", type=int, default=8, help="nodes, K (the inter peer group)")
    ap.add_argument("--optimizer", default="onebit_adam", choices=OPTIMIZERS)
    ap.add_argument("--codec", default="onebit", choices=CODECS)
    ap.add_argument("--param_dtype", default="fp32", choices=sorted(DTYPE_BYTES))
    ap.add_argument("--grad_dtype", default="fp32", choices=sorted(DTYPE_BYTES))
    ap.add_argument("--shard_state", type=parse_bool, default=False,
                    help="onebit.exchange.shard_state (true: the optimizer state sharded "
                         "across the node's workers)")
    ap.add_argument("--stage", default="compression", choices=STAGES)
    ap.add_argument("--workload", default="pytorch", choices=WORKLOADS,
                    help="pytorch (ExternalWorkload) or builtin (synthetic, mlp, fashion_mnist)")
    for flag in ("clip", "user_mask", "auto_mask", "accumulation"):
        ap.add_argument(f"--{flag}", action="store_true")
    ap.add_argument("--freeze_step", type=int, default=100000)
    ap.add_argument("--steps", type=int, default=10 ** 9)
    ap.add_argument("--report_interval", type=int, default=10)
    ap.add_argument("--table", action="store_true", help="the 1B/7B/13B table (Markdown)")
    ap.add_argument("--gpu_gib", type=float, default=80.0)
    ap.add_argument("--cpu_job", action="store_true",
                    help="a CPU worker's predicted peak RSS above its fixed part")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--check_refs", action="store_true",
                    help="check that every row's code is where the model says; exit 1 if not")
    a = ap.parse_args(argv)

    root = repo_root()
    if a.check_refs:
        if root is None:
            print("memory_model: no checkout beside this file", file=sys.stderr)
            return 1
        try:
            for key, at in locate(root).items():
                print(f"{key}: {at}")
        except LookupError as e:
            print(f"memory_model: {e}", file=sys.stderr)
            return 1
        return 0
    if a.table:
        print(table(a.local_size, a.nodes, a.gpu_gib))
        return 0
    if a.params is None:
        ap.error("--params is required (or --table, --check_refs)")
    c = Config(params=int(a.params), local_size=a.local_size, nodes=a.nodes,
               optimizer=a.optimizer, codec=a.codec, param_dtype=a.param_dtype,
               grad_dtype=a.grad_dtype, shard_state=a.shard_state, clip=a.clip,
               user_mask=a.user_mask, auto_mask=a.auto_mask, accumulation=a.accumulation,
               stage=a.stage, workload=a.workload, freeze_step=a.freeze_step, steps=a.steps,
               report_interval=a.report_interval)
    try:
        rows = buffers(c)
    except ValueError as e:
        print(f"memory_model: {e}", file=sys.stderr)
        return 2
    if a.json:
        on_dev, on_host, ram = (phase_bytes(c, m) for m in (("device",), ("host",),
                                                            ("device", "host")))
        print(json.dumps({
            "params": c.params, "config": describe(c),
            "device_bytes": total(live(rows, "device", c.stage)),
            "host_bytes": total(live(rows, "host", c.stage)),
            "cpu_job_peak_bytes": cpu_job_peak_bytes(c),
            # Each phase at its peak: a CPU worker's RAM (cpu_bytes: both memories), and a
            # GPU worker's device and host memory apart.
            "phases": {ph: dict(cpu_bytes=ram[ph], device_bytes=on_dev[ph],
                                host_bytes=on_host[ph]) for ph in ram},
            "buffers": [dict(name=r.name, where=where(r), memory=r.memory, when=r.when,
                             phases=list(r.phases()), moment=r.moment, bytes=r.nbytes,
                             design=r.design) for r in rows],
        }, indent=1))
        return 0
    print(report(c))
    if a.cpu_job:
        peak = cpu_job_peak_bytes(c)
        print(f"CPU job peak RSS above the fixed part: {peak / c.params:.2f} B/param, "
              f"{peak / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
