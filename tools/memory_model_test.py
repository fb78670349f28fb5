"""tools/memory_model.py: its layout, its closed forms, its refusals, its table, a PyTorch
worker's phases, the code its rows name, and its CPU prediction against the recorded peaks of
tools/bench_memory.sh and, phase by phase, of tools/bench_memory_torch.py."""
import collections
import csv
import io
import json
import os
import re
import statistics
import sys
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import memory_model as mm  # noqa: E402

RECORDED = os.path.join(os.path.dirname(HERE), "results", "bench", "2026-11-29",
                        "memory-step7", "results.csv")
# tools/bench_memory_torch.py's PyTorch workers (binaries of 1accea9), each phase's peak.
RECORDED_TORCH = os.path.join(os.path.dirname(HERE), "results", "bench", "2026-11-29",
                              "memory-torch-2", "results.csv")
CODEC_BYTES = {"onebit": 1 / 8, "int8": 1.0, "fp8": 33 / 32}


def per_param(**kw):
    c = mm.Config(**kw)
    return mm.per_gpu_bytes(c) / c.params


class LayoutTest(unittest.TestCase):
    def test_slice_is_a_multiple_of_the_inter_layout(self):
        # ceil(n/L) rounded up to a multiple of K * lcm(K, 8).
        self.assertEqual(mm.slice_size(2_000_000, 4, 2), 500_000)
        self.assertEqual(mm.slice_size(1001, 2, 3), 504)     # 501 -> multiple of 24
        self.assertEqual(mm.slice_size(10, 4, 1), 8)
        self.assertEqual(mm.peer_padded_size(12_730, 2), 12_736)

    def test_block_bytes(self):
        self.assertEqual(mm.block_bytes("onebit", 800), 104)
        self.assertEqual(mm.block_bytes("int8", 800), 808)
        self.assertEqual(mm.block_bytes("fp8", 800), 825)


class ClosedFormTest(unittest.TestCase):
    """The buffer sums against the module docstring's formulas (large n: headers vanish)."""
    N = 2 ** 30  # a multiple of every L * K * lcm(K, 8) below

    def seg(self, L):
        """The reduce-scatter's 2 x L rows of one segment, per parameter: O(1) bytes."""
        return 2 * 4 * L * mm.SEGMENT_ELEMENTS / self.N

    def check(self, formula, **kw):
        for codec, b in CODEC_BYTES.items():
            for L in (2, 4, 8):
                for K in (2, 8):
                    got = per_param(params=self.N, local_size=L, nodes=K, codec=codec, **kw)
                    self.assertAlmostEqual(got, formula(b, L, K) + self.seg(L), places=4,
                                           msg=f"{codec} L={L} K={K} {kw}")

    def test_unsharded(self):
        self.check(lambda b, L, K: 20 + b + (20 + 3 * b) / L + (8 + b) / (L * K))

    def test_unsharded_bf16_parameters_add_the_models_own_tensors(self):
        self.check(lambda b, L, K: 24 + b + (20 + 3 * b) / L + (8 + b) / (L * K),
                   param_dtype="bf16")

    def test_sharded_fp32(self):
        self.check(lambda b, L, K: 8 + (28 + 3 * b) / L + (8 + b) / (L * K), shard_state=True)

    def test_sharded_bf16_parameters(self):
        # The master slice (4/L) and the padded bf16 parameters (2) for p's 4; the model's
        # own bf16 .grad (2); stage_ stays a float slice.
        self.check(lambda b, L, K: 8 + (32 + 3 * b) / L + (8 + b) / (L * K),
                   shard_state=True, param_dtype="bf16")

    def test_sharded_bf16_parameters_and_gradients(self):
        # The padded bf16 parameters (2) and the bf16 gradient buffer the .grad tensors
        # view (2); the master slice 4/L; stage_ stays a float slice.
        self.check(lambda b, L, K: 4 + (32 + 3 * b) / L + (8 + b) / (L * K),
                   shard_state=True, param_dtype="bf16", grad_dtype="bf16")

    def test_one_node_has_no_inter_exchange(self):
        got = per_param(params=self.N, local_size=4, nodes=1)
        self.assertAlmostEqual(got, 20 + 8 / 4 + self.seg(4), places=6)  # no blocks, no inter

    def test_sharding_quarters_the_state_and_adds_one_slice_to_gather(self):
        # L = 4: m and v at 1/4 (8 -> 2 B/param), p whole, the all-gather's slice (1).
        def rows(shard):
            c = mm.Config(params=self.N, local_size=4, nodes=2, shard_state=shard)
            return {r.ref + ":" + r.name: r.nbytes / self.N for r in mm.buffers(c)}
        whole, shard = rows(False), rows(True)
        state = lambda rs: sum(v for k, v in rs.items() if k.startswith("mv:"))
        self.assertAlmostEqual(state(whole), 8)
        self.assertAlmostEqual(state(shard), 8 / 4)
        self.assertAlmostEqual(sum(v for k, v in shard.items() if k.startswith("stage:")), 1)
        self.assertFalse(any(k.startswith(("gathered:", "slice_m:", "blocks:")) for k in shard))

    def test_lamb_and_zero_one_add_three_tensors(self):
        base = per_param(params=self.N, local_size=4, nodes=2)
        self.assertAlmostEqual(per_param(params=self.N, local_size=4, nodes=2,
                                         optimizer="onebit_lamb") - base, 12, places=6)
        self.assertAlmostEqual(per_param(params=self.N, local_size=4, nodes=2,
                                         optimizer="zero_one_adam") - base, 12, places=6)
        # Sharded 1-bit LAMB: three slices, and ShardRows' L x S rows.
        sharded = per_param(params=self.N, local_size=4, nodes=2, shard_state=True)
        self.assertAlmostEqual(per_param(params=self.N, local_size=4, nodes=2, shard_state=True,
                                         optimizer="onebit_lamb") - sharded, 12 / 4 + 4,
                               places=6)


class FlagsTest(unittest.TestCase):
    N = 1 << 24

    def extra(self, **kw):
        base = dict(params=self.N, local_size=4, nodes=2, workload="builtin")
        stage = kw.pop("stage", "compression")
        return (per_param(**base, **kw, stage=stage) - per_param(**base, stage=stage))

    def test_flags(self):
        self.assertAlmostEqual(self.extra(clip=True), 4)
        # Sharded, the exchange clips as it sends (no copy), for 1-bit Adam and 1-bit LAMB.
        sharded = dict(params=self.N, local_size=4, nodes=2, workload="builtin",
                       shard_state=True)
        self.assertAlmostEqual(per_param(**sharded, clip=True) - per_param(**sharded), 0)
        self.assertAlmostEqual(per_param(**sharded, clip=True, optimizer="onebit_lamb")
                               - per_param(**sharded, optimizer="onebit_lamb"), 0)
        self.assertAlmostEqual(self.extra(accumulation=True), 4)
        self.assertAlmostEqual(self.extra(user_mask=True), 4)
        self.assertAlmostEqual(self.extra(auto_mask=True), 8)  # seen_, then mask_ at Fix
        self.assertAlmostEqual(self.extra(auto_mask=True, stage="warmup"), 4)
        self.assertAlmostEqual(self.extra(auto_mask=True, user_mask=True), 8)

    def test_host_rows(self):
        c = mm.Config(params=self.N, local_size=4, nodes=2, user_mask=True)
        host = mm.total(mm.live(mm.buffers(c), "host", "compression")) / self.N
        # Three mask copies and one initial copy, which EmbeddedWorker and ExternalWorkload
        # share (two copies before 1accea9).
        self.assertAlmostEqual(host, 12 + 4)

    def test_variance_copies_only_when_warmup_reaches_the_report_interval(self):
        job = dict(params=self.N, local_size=4, nodes=2, workload="builtin", steps=30)
        short = mm.cpu_job_peak_bytes(mm.Config(freeze_step=5, **job)) / self.N
        long = mm.cpu_job_peak_bytes(mm.Config(freeze_step=15, **job)) / self.N
        self.assertAlmostEqual(long - short, 4, places=3)  # 8 (copies) instead of 4 (Init)

    def test_refusals(self):
        for kw in (dict(optimizer="zero_one_adam", shard_state=True),
                   dict(grad_dtype="bf16", param_dtype="bf16"),
                   dict(grad_dtype="bf16", shard_state=True),
                   dict(grad_dtype="fp16", param_dtype="fp16", shard_state=True),
                   dict(grad_dtype="bf16", param_dtype="bf16", shard_state=True,
                        accumulation=True),
                   dict(optimizer="adam", stage="compression"),
                   dict(param_dtype="bf16", workload="builtin"),
                   dict(shard_state=True, local_size=1),
                   dict(codec="fp4")):
            with self.assertRaises(ValueError, msg=kw):
                mm.buffers(mm.Config(params=1000, **{"nodes": 2, **kw}))

    def test_no_row_is_design(self):
        rows = mm.buffers(mm.Config(params=self.N, shard_state=True, param_dtype="bf16",
                                    grad_dtype="bf16"))
        self.assertIn("external_grad16", [r.ref for r in rows])  # the bf16 gradient buffer
        self.assertNotIn("torch_low_grads", [r.ref for r in rows])  # .grad views it
        for r in rows:
            self.assertEqual(mm.where(r).startswith("DESIGN"), r.design, r.name)
        # Built today: unsharded, and sharded with fp32, bf16 or fp16 parameters.
        for kw in (dict(), dict(shard_state=True, clip=True, user_mask=True, auto_mask=True),
                   dict(shard_state=True, param_dtype="bf16", grad_dtype="bf16", clip=True),
                   dict(shard_state=True, param_dtype="bf16", clip=True, auto_mask=True),
                   dict(shard_state=True, param_dtype="fp16", optimizer="onebit_lamb"),
                   dict(shard_state=True, optimizer="adam", stage="warmup"),
                   dict(shard_state=True, optimizer="onebit_lamb", clip=True)):
            rows = mm.buffers(mm.Config(params=self.N, **kw))
            self.assertFalse([r.name for r in rows if r.design], kw)


class PhasesTest(unittest.TestCase):
    """A PyTorch worker's phases (join, init, the stages, end, unbind) against what the code
    keeps alive in each, in B/param at large n (the segment rows are the same in every
    phase)."""
    N = 2 ** 30
    A = dict(param_dtype="bf16", grad_dtype="bf16", shard_state=True)  # bench_memory_torch's
    B = dict(param_dtype="bf16")
    C = dict(shard_state=True)

    def phases(self, memories=("device", "host"), local_size=4, nodes=2, **kw):
        c = mm.Config(params=self.N, local_size=local_size, nodes=nodes, freeze_step=5,
                      steps=30, **kw)
        return {k: v / self.N for k, v in mm.phase_bytes(c, memories).items()}

    def test_a_pytorch_job_has_every_phase_and_a_builtin_one_none_of_the_packages(self):
        self.assertEqual(list(self.phases(**self.A)), list(mm.PHASES))
        self.assertEqual(list(self.phases(workload="builtin")),
                         ["init", "warmup", "compression"])

    def test_init_adds_trainer_inits_copy_and_the_models_own_tensors(self):
        # Above training: Trainer::Init's initial (4) and the model's own parameters until
        # bind (2 bf16, 4 fp32). current()'s copy is gone (dropped before start()).
        # p_low_host (2 L S bytes) is freed before m and v (8 S) exist: 0 at L = 4.
        for kw, extra in ((self.A, 4 + 2), (self.C, 4 + 4),
                          # B keeps its own tensors (a training row); its .grad comes later.
                          (self.B, 4 - 2)):
            ph = self.phases(**kw)
            self.assertAlmostEqual(ph["init"] - ph["compression"], extra, places=6, msg=kw)

    def test_the_bf16_cast_adds_what_exceeds_m_and_v(self):
        # L = 8: the cast is 2 B/param, m and v 8/8 = 1, so 1 more at init.
        ph = self.phases(local_size=8, **self.A)
        self.assertAlmostEqual(ph["init"] - ph["compression"], 4 + 2 + 1, places=6)
        # 1-bit LAMB makes three more state buffers after it (12/8): none more. (Its rows
        # come at the first compression step: compare with warmup.)
        ph = self.phases(local_size=8, optimizer="onebit_lamb", **self.A)
        self.assertAlmostEqual(ph["init"] - ph["warmup"], 4 + 2, places=6)
        # On a GPU m and v are device memory: the host holds the whole cast.
        host = self.phases(("host",), local_size=8, **self.A)
        self.assertAlmostEqual(host["init"], 4 + 4 + 2, places=6)

    def test_end_adds_after_runs_copies(self):
        # The final parameters (4), then p, m, v of the state range (12 or 12/L) and the
        # inter errors (S + S/K floats: 1.5 at L = 4, K = 2). A bf16 worker's ParamsToHost
        # copy of p_low_ (2) is freed before the state is copied.
        for kw, extra in ((self.A, 4 + 3 + 1.5), (self.C, 4 + 3 + 1.5), (self.B, 4 + 12 + 1.5)):
            ph = self.phases(**kw)
            self.assertAlmostEqual(ph["end"] - ph["compression"], extra, places=6, msg=kw)
        # On the host of a GPU worker at L = 8, K = 8: the shared copy, the final
        # parameters, and the larger moment: the bf16 copy (2) or the state (1.5) and the
        # errors (0.5625); at K = 1 no errors, so the bf16 copy.
        host = self.phases(("host",), local_size=8, nodes=8, **self.A)
        self.assertAlmostEqual(host["end"], 4 + 4 + 2.0625, places=6)
        host = self.phases(("host",), local_size=8, nodes=1, **self.A)
        self.assertAlmostEqual(host["end"], 4 + 4 + 2, places=6)

    def test_unbind_copies_the_final_parameters_once_more(self):
        # After the worker's buffers are freed: the shared initial copy, final_params_ and
        # final_state_, then the tensor FinalParams fills straight from final_params_ (4).
        host = self.phases(("host",), **self.C)
        self.assertAlmostEqual(host["unbind"], 4 + 4 + 4.5 + 4, places=6)
        dev = self.phases(("device",), **self.C)
        self.assertAlmostEqual(dev["unbind"], 4, places=6)  # the tensors' own fp32 again
        self.assertAlmostEqual(self.phases(("device",), **self.B)["unbind"], 4, places=6)

    def test_the_peak_is_the_largest_phase(self):
        for kw in (self.A, self.B, self.C, dict(workload="builtin")):
            c = mm.Config(params=self.N, local_size=4, nodes=2, freeze_step=5, steps=30, **kw)
            self.assertEqual(mm.cpu_job_peak_bytes(c), max(mm.phase_bytes(c).values()))
        # After 1accea9 the peak of A, B and C is the end phase (A's and C's was init).
        for kw in (self.A, self.B, self.C):
            ph = self.phases(**kw)
            self.assertEqual(max(ph, key=ph.get), "end", kw)

    def test_one_shared_initial_copy_and_no_python_copy_while_training(self):
        rows = mm.buffers(mm.Config(params=self.N, **self.A))
        self.assertEqual([r.ref for r in rows if r.ref == "embedded_initial"],
                         ["embedded_initial"])
        current = next(r for r in rows if r.ref == "torch_current")
        self.assertEqual(current.phases(), ("join",))
        own = next(r for r in rows if r.ref == "torch_bind")
        self.assertEqual((own.memory, own.phases()), ("device", ("init", "join")))
        # The table's figure is training: no init-only row counts in it.
        c = mm.Config(params=self.N, **self.A)
        self.assertEqual(mm.per_gpu_bytes(c),
                         mm.phase_total(rows, "compression", ("device",)))

    def test_json_shows_each_phase(self):
        out = io.StringIO()
        with redirect_stdout(out):
            mm.main(["--params", "16777216", "--local_size", "4", "--nodes", "2",
                     "--shard_state", "true", "--param_dtype", "bf16", "--grad_dtype", "bf16",
                     "--freeze_step", "5", "--steps", "30", "--json"])
        got = json.loads(out.getvalue())
        self.assertEqual(list(got["phases"]), list(mm.PHASES))
        self.assertEqual(got["cpu_job_peak_bytes"],
                         max(p["cpu_bytes"] for p in got["phases"].values()))
        for p in got["phases"].values():
            self.assertLessEqual(max(p["device_bytes"], p["host_bytes"]), p["cpu_bytes"])


class TableTest(unittest.TestCase):
    def test_table(self):
        text = mm.table(8, 8, 80.0)
        rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()
                if line.startswith("| ") and not line.startswith("| setup")}
        fits = {k: v.rstrip(" |").split(" | ")[-1] for k, v in rows.items()}
        self.assertEqual(fits["onebit unsharded, fp32 parameters"], "1B (59)")
        self.assertEqual(fits["onebit sharded, fp32 parameters"], "1B (69), 7B (4)")
        self.assertEqual(fits["onebit sharded, bf16 parameters, bf16 gradient buffer"],
                         "1B (72), 7B (26)")
        self.assertTrue(all("13B" not in v for k, v in fits.items() if "onebit" in k))
        self.assertTrue(all("7B" not in v for k, v in fits.items()
                            if k.startswith("onebit unsharded")))
        self.assertIn("only as onebit sharded, bf16 parameters, bf16 gradient buffer (the "
                      "other rows leave under 16 GiB)", text)
        self.assertNotIn("DESIGN", text)
        self.assertIn("| ZeRO-1, mixed precision | 4.19 |", text)
        self.assertIn("| DDP + Adam (fp32 p, g, m, v) | 16.00 |", text)
        # Startup: the model's own bf16 parameters beside the worker's buffers until bind.
        self.assertIn("2 B/param for bf16 (13.0 GiB at 7B), 4 for fp32", text)
        self.assertIn("onebit sharded, bf16 parameters, bf16 gradient buffer at startup: "
                      "10.21 B/param, 7B leaves 13 GiB.", text)
        self.assertIn("onebit sharded, fp32 parameters at startup: 15.71 B/param, 7B is 22 GiB "
                      "over.", text)
        # One host copy of the initial parameters while training (two before 1accea9).
        self.assertIn("4 B/param, 26.1 GiB per process at 7B, 208.6 GiB per node of 8", text)

    def test_cli(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(mm.main(["--table"]), 0)
            self.assertEqual(mm.main(["--params", "7e9", "--param_dtype", "bf16"]), 0)
        self.assertIn("7B (GiB)", out.getvalue())
        self.assertIn("hierarchical: gathered_", out.getvalue())


class CodeReferencesTest(unittest.TestCase):
    """Every row names code that is there. Bazel does not rerun this test when only those
    sources change (they are not its data): the checkout is found through the runfiles'
    links."""

    def test_every_reference_is_found(self):
        root = mm.repo_root()
        if root is None:
            self.skipTest("no checkout beside memory_model.py")
        found = mm.locate(root)
        self.assertEqual(set(found), set(mm.REFS))
        for c in (mm.Config(params=1 << 20, clip=True, user_mask=True, auto_mask=True,
                            accumulation=True, optimizer=o, shard_state=shard)
                  for o in mm.OPTIMIZERS if o != "adam" for shard in (False, True)
                  if not (shard and o == "zero_one_adam")):
            for r in mm.buffers(c):
                self.assertIn(r.ref, found)
                self.assertNotRegex(mm.where(r), r":\d")  # files and symbols, never lines

    def source(self, path):
        root = mm.repo_root()
        if root is None:
            self.skipTest("no checkout beside memory_model.py")
        with open(os.path.join(root, path)) as f:
            return f.read()

    def test_the_phases_follow_the_code(self):
        # One host copy of the initial parameters: onebit_worker_new's, shared.
        self.assertRegex(self.source("python/c_api.cc"),
                         r"EmbeddedWorker::Create\(\s*o->options, std::vector<float>\(initial, "
                         r"initial \+ n\)")
        self.assertRegex(self.source("worker/workloads/external_workload.h"),
                         r"std::shared_ptr<const std::vector<float>> initial;")
        # current()'s copy is dropped between Worker() and start(): Trainer::Init, on the
        # worker's thread, runs after start().
        joined = self.source("python/onebit/_optimizer.py")
        at = [joined.find(s) for s in ("initial = self._flat.current()", "_core().Worker(",
                                       "del initial", "self._worker.start()",
                                       "self._flat.bind(self._worker)")]
        self.assertNotIn(-1, at)
        self.assertEqual(at, sorted(at), "current(), Worker(), del, start(), bind")
        # InitCommon frees its host cast before it makes m and v.
        base = self.source("worker/optim/optimizer_base.h")
        body = base[base.index("absl::Status InitCommon("):]
        cast = body.index("std::vector<uint16_t> low(")
        closes = body.index("} else {", cast)
        self.assertLess(closes, body.index("for (Buffer<float>* b : {&m_, &v_})"))
        # after_run copies the parameters, then the state: both kept for state_dict().
        embedded = self.source("python/embedded.cc")
        run = embedded[embedded.index("o.after_run = "):]
        self.assertLess(run.index("ParamsToHost()"), run.index("Save(trainer)"))

    def test_the_segment_is_the_exchanges(self):
        root = mm.repo_root()
        if root is None:
            self.skipTest("no checkout beside memory_model.py")
        with open(os.path.join(root, "worker/exchange/hierarchical_exchange.h")) as f:
            m = re.search(r"size_t segment_elements = size_t\{1\} << (\d+);", f.read())
        self.assertIsNotNone(m, "HierarchicalOptions::segment_elements's default moved")
        self.assertEqual(mm.SEGMENT_ELEMENTS, 1 << int(m.group(1)))


class RecordedPeaksTest(unittest.TestCase):
    """The CPU prediction against tools/bench_memory.sh's recorded runs (within 5%)."""

    def test_slopes(self):
        with open(RECORDED) as f:
            rows = list(csv.DictReader(f))
        runs = collections.defaultdict(lambda: collections.defaultdict(dict))
        for r in rows:
            key = (r["shard_state"], int(r["nodes"]), int(r["local_size"]), int(r["steps"]),
                   int(r["freeze_step"]))
            runs[key][int(r["params"])][int(r["rank"])] = int(r["peak_rss_bytes"])
        self.assertEqual({k[0] for k in runs}, {"true", "false"})
        for (shard, nodes, local, steps, freeze), sizes in runs.items():
            small, large = sorted(sizes)
            measured = statistics.mean((sizes[large][w] - sizes[small][w]) / (large - small)
                                       for w in sizes[small])

            def peak(n):
                return mm.cpu_job_peak_bytes(mm.Config(
                    params=n, local_size=local, nodes=nodes, workload="builtin",
                    shard_state=shard == "true", freeze_step=freeze, steps=steps))
            predicted = (peak(large) - peak(small)) / (large - small)
            self.assertLess(abs(measured / predicted - 1), 0.05,
                            f"shard_state {shard}: measured {measured:.2f}, model "
                            f"{predicted:.2f} B/param")


class RecordedTorchPeaksTest(unittest.TestCase):
    """Each phase of a PyTorch worker against tools/bench_memory_torch.py's recorded run
    (within 3%). A_none (set_to_none=True) is left out: the model keeps the .grad views."""
    # The script's phases in the model's (bench_memory_torch.py MODEL_PHASES).
    PHASES = {"init": ("join", "init"), "train": ("warmup", "compression"),
              "end": ("end", "unbind")}

    def test_slopes_by_phase(self):
        with open(RECORDED_TORCH) as f:
            rows = [r for r in csv.DictReader(f) if r["set_to_none"] == "false"]
        runs = collections.defaultdict(lambda: collections.defaultdict(dict))
        for r in rows:
            key = (r["setup"], r["torch_dtype"], r["shard_state"], r["gradient_buffer"],
                   int(r["nodes"]), int(r["local_size"]), int(r["steps"]),
                   int(r["freeze_step"]))
            runs[key][int(r["params"])][int(r["rank"])] = r
        self.assertEqual({k[0] for k in runs}, {"A", "B", "C"})
        for (setup, dtype, shard, grad, nodes, local, steps, freeze), sizes in runs.items():
            small, large = sorted(sizes)
            pdt = {"bfloat16": "bf16", "float32": "fp32"}[dtype]

            def model(n, phase):
                ph = mm.phase_bytes(mm.Config(
                    params=n, local_size=local, nodes=nodes, param_dtype=pdt, grad_dtype=grad,
                    shard_state=shard == "true", freeze_step=freeze, steps=steps))
                return max(ph[p] for p in self.PHASES[phase])

            for phase in self.PHASES:
                col = f"{phase}_peak_bytes"
                measured = statistics.mean(
                    (int(sizes[large][w][col]) - int(sizes[small][w][col])) / (large - small)
                    for w in sizes[small])
                predicted = (model(large, phase) - model(small, phase)) / (large - small)
                self.assertLess(abs(measured / predicted - 1), 0.03,
                                f"{setup} {phase}: measured {measured:.2f}, model "
                                f"{predicted:.2f} B/param")


if __name__ == "__main__":
    unittest.main()
