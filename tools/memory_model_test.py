"""tools/memory_model.py: its layout, its closed forms, its refusals, its table, the code its
rows name, and its CPU prediction against the recorded peaks of tools/bench_memory.sh."""
import collections
import csv
import io
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
        self.assertAlmostEqual(host, 12 + 8)  # three mask copies, two Python initial copies

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


if __name__ == "__main__":
    unittest.main()
