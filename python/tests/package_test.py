"""onebit.torch as a user runs it: real jobs through onebit-launch (a coordinator, gloo
between two Python processes), against onebit-replay on the same gradient stream, and the
clear errors of bad input.

    package_test.py BIN_DIR     (BIN_DIR holds deploy/onebit-launch, tools/onebit-replay,
                                 tools/onebit-gradient-stream; the tests/ BUILD passes it)
"""
import json
import re
import os
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = None
N, T, W = 1003, 30, 2
SPLIT = 400  # 1-bit LAMB's two "layers"


def job_config(optimizer, params, parameters=N, workers=W, steps=T):
    return {
        "train_micro_batch_size_per_gpu": 1, "steps": steps, "seed": 1,
        "optimizer": {"type": optimizer, "params": params},
        "onebit": {"workers": workers, "device": "cpu", "exchange": {"mode": "peer"},
                   "freeze": {"mode": "static"}, "log_every": 10,
                   "failure": {"max_restarts": 0, "heartbeat_timeout_s": 5},
                   "workload": {"type": "pytorch", "parameters": parameters}},
    }


def launch(tmp, config, script_args, timeout=300, launcher_args=()):
    os.makedirs(tmp, exist_ok=True)
    path = os.path.join(tmp, "job.json")
    with open(path, "w") as f:
        json.dump(config, f)
    cmd = [os.path.join(BIN, "deploy/onebit-launch"), "--config=" + path,
           "--out_dir=" + os.path.join(tmp, "out"), "--echo_all=false", "--timeout_s=120",
           "--bin_dir=" + BIN, *launcher_args, "--", sys.executable] + [a.replace("{config}", path) for a in script_args]
    env = dict(os.environ)
    # The package's sources sit beside this file; the extension in BIN/python.
    env["PYTHONPATH"] = os.path.dirname(HERE)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


class StreamCase(unittest.TestCase):
    """A recorded gradient stream of W workers, T steps, N parameters."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="onebit-pkg-")
        subprocess.run([os.path.join(BIN, "tools/onebit-gradient-stream"), f"--workers={W}",
                        f"--steps={T}", f"--n={N}", "--out_dir=" + cls.tmp], check=True,
                       capture_output=True)

    def replay(self, out, flags):
        """onebit-replay over the stream (gloo, W workers) with these flags: its parameters."""
        subprocess.run([os.path.join(BIN, "tools/onebit-replay"), f"--workers={W}",
                        "--params=" + os.path.join(self.tmp, "params.npy"),
                        "--grads=" + os.path.join(self.tmp, "grads.npy"), "--out=" + out,
                        "--transport=gloo"] + flags, check=True, capture_output=True)
        return np.load(out)

    def assertSameBits(self, got, want):
        # Bit for bit, not close: the same optimizer and exchange, fed from Python.
        self.assertTrue(np.array_equal(got.view(np.uint32), want.view(np.uint32)),
                        f"max difference {np.abs(got - want).max()}")


class SameBitsAsReplay(StreamCase):
    """The package's optimizers on a recorded stream: the bits of onebit-replay (itself
    tested against the float64 models of docs/algorithms.md, tests:replay_test)."""

    def run_both(self, name, optimizer, params, replay_flags, split="", edit=None):
        tmp = tempfile.mkdtemp(prefix=name + "-", dir=self.tmp)
        out = os.path.join(tmp, "package.npy")
        config = job_config(optimizer, params)
        if edit:
            edit(config)
        r = launch(tmp, config,
                   [os.path.join(HERE, "stream_train.py"), "{config}",
                    os.path.join(self.tmp, "params.npy"), os.path.join(self.tmp, "grads.npy"),
                    out, optimizer, split])
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        got, want = np.load(out), self.replay(os.path.join(tmp, "replay.npy"), replay_flags)
        self.assertEqual(got.shape, (N,))
        self.assertSameBits(got, want)
        initial = np.load(os.path.join(self.tmp, "params.npy"))
        self.assertGreater(np.abs(got - initial).max(), 1e-3)  # it did train
        return os.path.join(tmp, "out", "onebit_adam")

    def test_onebit_adam(self):
        # With a state_dict taken and loaded back mid-run (at step 15, in the compression
        # stage): still the same bits.
        os.environ["CHECK_STATE_AT"] = "16"
        try:
            logs = self.run_both("adam1", "OneBitAdam",
                          {"lr": 0.01, "eps": 1e-8, "weight_decay": 0.001, "freeze_step": 10},
                          ["--lr=0.01", "--eps=1e-8", "--weight-decay=0.001", "--freeze-step=10"])
        finally:
            del os.environ["CHECK_STATE_AT"]
        for rank in range(W):
            with open(os.path.join(logs, f"worker-{rank}.log")) as f:
                self.assertIn(f"rank {rank}: state_dict checked at step 15", f.read())

    def test_ps_shards_learn_the_models_size(self):
        # A ps job whose config leaves the model's size to the workers (parameters 0): the
        # shards learn it from the coordinator. With S = W shards the bits are peer mode's.
        def ps_without_size(config):
            config["onebit"]["workload"]["parameters"] = 0
            config["onebit"]["exchange"] = {"mode": "ps", "servers": W}
        logs = self.run_both("ps", "OneBitAdam", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10},
                             ["--lr=0.01", "--eps=1e-8", "--freeze-step=10"], edit=ps_without_size)
        for shard in range(W):
            with open(os.path.join(logs, f"server-{shard}.log")) as f:
                self.assertIn(f"the workers' model has {N} parameters", f.read())

    def test_ps_with_the_warmup_between_the_workers(self):
        # exchange.warmup_over "workers": the warmup over gloo between the workers, the shards
        # from the first compressed step on; in rank order the bits of the shards' warmup.
        def ps_warmup_workers(config):
            config["onebit"]["exchange"] = {"mode": "ps", "servers": W, "warmup_over": "workers",
                                            "warmup_order": "rank"}
        self.run_both("psw", "OneBitAdam", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10},
                      ["--lr=0.01", "--eps=1e-8", "--freeze-step=10"], edit=ps_warmup_workers)

    def test_saved_with_torch_save_and_resumed_in_a_fresh_job(self):
        # A job of 12 steps saves each rank's final state_dict with torch.save; a fresh job
        # of T steps loads them before its first step and starts after step 12: the bits
        # of one uninterrupted T-step run (moments, errors and the freeze all carried).
        tmp = tempfile.mkdtemp(prefix="resume-", dir=self.tmp)
        params = {"lr": 0.01, "eps": 1e-8, "freeze_step": 10}
        states = os.path.join(tmp, "state-{rank}.pt")
        script = [os.path.join(HERE, "stream_train.py"), "{config}",
                  os.path.join(self.tmp, "params.npy"), os.path.join(self.tmp, "grads.npy"),
                  os.path.join(tmp, "package.npy"), "OneBitAdam"]
        def job(name, config, **env):  # a launch with these variables, which must succeed
            os.environ.update(env)
            try:
                r = launch(os.path.join(tmp, name), config, script)
            finally:
                for key in env:
                    del os.environ[key]
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])

        job("first", job_config("OneBitAdam", params, steps=12), SAVE_STATE=states)
        job("second", job_config("OneBitAdam", params), LOAD_STATE=states)
        with open(os.path.join(tmp, "second", "out", "onebit_adam", "coordinator.log")) as f:
            self.assertIn("the job starts after step 12: its workers loaded saved states", f.read())
        self.assertSameBits(np.load(os.path.join(tmp, "package.npy")),
                            self.replay(os.path.join(tmp, "replay.npy"),
                                        ["--lr=0.01", "--eps=1e-8", "--freeze-step=10"]))

        # Rank 0's state loaded by both ranks (a rank-0-only torch.save): rank 1's error
        # buffers start at zero, and it says so.
        job("third", job_config("OneBitAdam", params), LOAD_STATE=states.replace("{rank}", "0"))
        with open(os.path.join(tmp, "third", "out", "onebit_adam", "worker-1.log")) as f:
            self.assertIn("worker rank 1: error buffers reset (the state was saved by rank 0 "
                          "of 2 workers; this is rank 1 of 2)", f.read())

        # Rank 1's state without its exp_avg: the job fails at once, naming the worker and
        # the state (before: its worker stopped silently, and the job recovered from what
        # it took for a lost process, again at every restart).
        import torch
        broken = os.path.join(tmp, "broken-{rank}.pt")
        for rank in range(W):
            state = torch.load(states.format(rank=rank))
            if rank == 1:
                for entry in state["optimizer"]["state"].values():
                    del entry["exp_avg"]
            torch.save(state, broken.format(rank=rank))
        os.environ["LOAD_STATE"] = broken
        try:
            r = launch(os.path.join(tmp, "fourth"), job_config("OneBitAdam", params), script)
        finally:
            del os.environ["LOAD_STATE"]
        self.assertNotEqual(r.returncode, 0)
        with open(os.path.join(tmp, "fourth", "out", "onebit_adam", "coordinator.log")) as f:
            self.assertRegex(f.read(), r"job FAILED: worker 1 \([^)]+\) failed, which no restart "
                                       r"fixes: its loaded state: the state's exp_avg is missing")

    def test_zero_one_adam(self):
        # The gradients through zero_grad(set_to_none=True) and backward (torch 2's default
        # zero_grad), not written into .grad in place: the same bits.
        os.environ["BACKWARD_SET_TO_NONE"] = "1"
        self.addCleanup(os.environ.pop, "BACKWARD_SET_TO_NONE")
        self.run_both("zeroone", "ZeroOneAdam",
                      {"lr": 0.01, "eps": 1e-8, "var_freeze_step": 12, "var_update_scaler": 2,
                       "local_step_scaler": 4, "local_step_clipper": 4},
                      ["--optimizer=zero_one_adam", "--lr=0.01", "--eps=1e-8",
                       "--var-freeze-step=12", "--var-update-scaler=2", "--local-step-scaler=4",
                       "--local-step-clipper=4"])

    def test_fp16_loss_scaling(self):
        # The config's fp16 block as DeepSpeed configs have it: the script's backward runs on
        # opt.scale(loss) (2^16), the trainer divides the scale out: with a power-of-two scale
        # and no overflow the bits of the unscaled replay.
        self.addCleanup(os.environ.pop, "BACKWARD_SET_TO_NONE")
        self.addCleanup(os.environ.pop, "LOSS_SCALED")
        os.environ.update(BACKWARD_SET_TO_NONE="1", LOSS_SCALED="1")

        def fp16(config):
            config["fp16"] = {"enabled": True}

        logs = self.run_both("fp16", "OneBitAdam", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10},
                             ["--lr=0.01", "--eps=1e-8", "--freeze-step=10"], split=str(SPLIT),
                             edit=fp16)
        for rank in range(W):
            with open(os.path.join(logs, f"worker-{rank}.log")) as f:
                text = f.read()
            self.assertIn("loss scale 65536  skipped 0", text)
            self.assertNotIn("exchange overlap: on", text)  # off by default under fp16

    def test_fp16_overflow_on_one_worker_is_skipped_by_every_worker(self):
        # Rank 1's scaled gradient overflows (its loss times 1e38): both workers skip the step
        # (no parameter moves) and halve the scale, rank 0 although its own gradient was
        # finite; the job goes on and ends. In the warmup of a peer job, and in the
        # compression stage of a ps job (its shards see a step that pushed nothing).
        for name, exchange, step in (("peer", {"mode": "peer"}, 5),
                                     ("ps", {"mode": "ps", "servers": W}, 15)):
            with self.subTest(name):
                tmp = tempfile.mkdtemp(prefix=f"fp16-overflow-{name}-", dir=self.tmp)
                config = job_config("OneBitAdam", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10})
                config["fp16"] = {"enabled": True, "initial_scale_power": 4, "hysteresis": 1}
                config["onebit"]["exchange"] = exchange
                env = dict(BACKWARD_SET_TO_NONE="1", LOSS_SCALED="1", OVERFLOW_AT=f"1:{step}")
                os.environ.update(env)
                try:
                    r = launch(tmp, config, [os.path.join(HERE, "stream_train.py"), "{config}",
                                             os.path.join(self.tmp, "params.npy"),
                                             os.path.join(self.tmp, "grads.npy"),
                                             os.path.join(tmp, "package.npy"), "OneBitAdam"])
                finally:
                    for key in env:
                        del os.environ[key]
                self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
                for rank in range(W):
                    with open(os.path.join(tmp, "out", "onebit_adam",
                                           f"worker-{rank}.log")) as f:
                        text = f.read()
                    self.assertIn(f"rank {rank}: step {step}: parameters unchanged: True, "
                                  "loss scale 16 -> 8", text)
                    self.assertIn("loss scale 8  skipped 1", text)

    def test_betas_a_torch_scheduler_writes(self):
        # betas written into param_groups before the first step (OneCycleLR's momentum
        # cycling writes them at every step): the bits of a job built with them (before:
        # silently the betas the optimizer was built with).
        self.addCleanup(os.environ.pop, "SET_BETAS")
        os.environ["SET_BETAS"] = "1:0.8,0.99"
        self.run_both("betas", "OneBitAdam", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10},
                      ["--lr=0.01", "--eps=1e-8", "--freeze-step=10", "--beta1=0.8",
                       "--beta2=0.99"], split=str(SPLIT))

    def test_set_to_none_without_overlap(self):
        # Every .grad a tensor of backward's own, two tensors, no overlap hooks to copy them
        # as backward ends each: step() copies them all into the flat buffer at once (one
        # torch.cat). The same bits.
        os.environ["BACKWARD_SET_TO_NONE"] = "1"
        self.addCleanup(os.environ.pop, "BACKWARD_SET_TO_NONE")

        def without_overlap(config):
            config["onebit"]["exchange"]["overlap"] = False

        self.run_both("nooverlap", "OneBitAdam", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10},
                      ["--lr=0.01", "--eps=1e-8", "--freeze-step=10"], split=str(SPLIT),
                      edit=without_overlap)

    def test_onebit_lamb_with_two_layers(self):
        self.run_both("lamb", "OneBitLamb", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10},
                      ["--optimizer=onebit_lamb", "--lr=0.01", "--eps=1e-8", "--freeze-step=10",
                       f"--groups=0,{SPLIT},{N}"], split=str(SPLIT))


class ParamGroups(StreamCase):
    """Param groups with their own lr and weight decay: each group gets the bits onebit-replay
    gives the whole model with that group's lr and decay (1-bit Adam exchanges only the
    momentum, which neither changes)."""

    def group_replay(self, tmp, name, flags):
        return self.replay(os.path.join(tmp, name), ["--eps=1e-8", "--freeze-step=10"] + flags)

    def test_two_groups_with_their_own_lr_and_weight_decay(self):
        tmp = tempfile.mkdtemp(prefix="groups-", dir=self.tmp)
        out = os.path.join(tmp, "package.npy")
        os.environ["SECOND_GROUP"] = "0.02,0.1"
        try:
            r = launch(tmp, job_config("OneBitAdam", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10}),
                       [os.path.join(HERE, "stream_train.py"), "{config}",
                        os.path.join(self.tmp, "params.npy"), os.path.join(self.tmp, "grads.npy"),
                        out, "OneBitAdam", str(SPLIT)])
        finally:
            del os.environ["SECOND_GROUP"]
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        got = np.load(out).view(np.uint32)
        first = self.group_replay(tmp, "first.npy", ["--lr=0.01", "--weight-decay=0"]).view(np.uint32)
        second = self.group_replay(tmp, "second.npy", ["--lr=0.02", "--weight-decay=0.1"]).view(np.uint32)
        self.assertTrue(np.array_equal(got[:SPLIT], first[:SPLIT]))
        self.assertTrue(np.array_equal(got[SPLIT:], second[SPLIT:]))
        self.assertFalse(np.array_equal(got[SPLIT:], first[SPLIT:]))  # the group's own did act

    def test_a_weight_decay_schedule_and_a_state_that_restores_it(self):  # and betas
        # The second group built with decay 0.1, which the script's schedule sets to 0 before
        # step 1: the bits of a run built with 0 (onebit-replay's), group by group. Then a
        # job that saves its state after 14 steps of that schedule, and a fresh one built
        # with 0.1 again that loads it: load_state_dict puts the saved decay (0) back into
        # param_groups, as torch.optim's does, and it applies from the first step.
        tmp = tempfile.mkdtemp(prefix="decay-", dir=self.tmp)
        params = {"lr": 0.01, "eps": 1e-8, "freeze_step": 10}
        states = os.path.join(tmp, "state-{rank}.pt")

        def job(name, steps, **env):
            env = dict(env, SECOND_GROUP="0.02,0.1")
            os.environ.update(env)
            try:
                r = launch(os.path.join(tmp, name), job_config("OneBitAdam", params, steps=steps),
                           [os.path.join(HERE, "stream_train.py"), "{config}",
                            os.path.join(self.tmp, "params.npy"),
                            os.path.join(self.tmp, "grads.npy"),
                            os.path.join(tmp, name + ".npy"), "OneBitAdam", str(SPLIT)])
            finally:
                for key in env:
                    del os.environ[key]
            self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
            return np.load(os.path.join(tmp, name + ".npy")).view(np.uint32)

        scheduled = job("scheduled", T, SET_WEIGHT_DECAY="1:1:0.0")
        first = self.group_replay(tmp, "first.npy", ["--lr=0.01", "--weight-decay=0"])
        second = self.group_replay(tmp, "second.npy", ["--lr=0.02", "--weight-decay=0"])
        self.assertTrue(np.array_equal(scheduled[:SPLIT], first.view(np.uint32)[:SPLIT]))
        self.assertTrue(np.array_equal(scheduled[SPLIT:], second.view(np.uint32)[SPLIT:]))
        job("saved", 14, SET_WEIGHT_DECAY="1:1:0.0", SAVE_STATE=states)
        resumed = job("resumed", T, LOAD_STATE=states)
        self.assertTrue(np.array_equal(resumed, scheduled))
        built = job("built", T)  # no schedule: the built decay 0.1 acts
        self.assertFalse(np.array_equal(built[SPLIT:], scheduled[SPLIT:]))
        # The betas a scheduler wrote come back the same way (OneCycleLR's momentum
        # cycling; before, only lr and weight_decay did, and such a resume went elsewhere).
        moved = job("betas", T, SET_BETAS="1:0.8,0.99")
        job("betas-saved", 14, SET_BETAS="1:0.8,0.99", SAVE_STATE=states)
        self.assertTrue(np.array_equal(job("betas-resumed", T, LOAD_STATE=states), moved))
        self.assertFalse(np.array_equal(moved, built))


class TorchLrScheduler(StreamCase):
    """What torch scripts do each step takes effect at that step, exactly: a torch
    lr_scheduler (LambdaLR setting lr 0 after step 20 of 30 leaves the bits of a 20-step
    job), and clip_grad_norm_ (the bits of the config's gradient_clipping)."""

    def run_job(self, name, steps, extra_env, clipping=0, micro_batches=1, expect_ok=True):
        tmp = tempfile.mkdtemp(prefix=name + "-", dir=self.tmp)
        out = os.path.join(tmp, "package.npy")
        extra_env = dict(extra_env, MICRO_BATCHES=str(micro_batches))
        saved = {k: os.environ.get(k) for k in extra_env}
        os.environ.update(extra_env)
        config = job_config("OneBitAdam", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10},
                            steps=steps)
        config["gradient_clipping"] = clipping
        config["gradient_accumulation_steps"] = micro_batches
        if steps is None:  # open-ended: the job ends where the loops do (LOOP_STEPS)
            del config["steps"]
        try:
            r = launch(tmp, config,
                       [os.path.join(HERE, "stream_train.py"), "{config}",
                        os.path.join(self.tmp, "params.npy"), os.path.join(self.tmp, "grads.npy"),
                        out, "OneBitAdam"])
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        if not expect_ok:
            return r
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        return np.load(out)

    def test_lambda_lr_to_zero_equals_a_shorter_job(self):
        scheduled = self.run_job("lambdalr", T, {"LR_ZERO_AFTER": "20"})
        shorter = self.run_job("twenty", 20, {})
        self.assertTrue(np.array_equal(scheduled.view(np.uint32), shorter.view(np.uint32)),
                        f"max difference {np.abs(scheduled - shorter).max()}")
        full = self.run_job("thirty", T, {})
        self.assertFalse(np.array_equal(scheduled, full))  # the scheduler did act

    def test_clip_grad_norm_is_the_configs_gradient_clipping(self):
        # Both warmup (steps 1-10: the averaged gradient) and compression (the local one).
        by_script = self.run_job("clipscript", T, {"CLIP_EACH_STEP": "0.05"})
        by_config = self.run_job("clipconfig", T, {}, clipping=0.05)
        self.assertTrue(np.array_equal(by_script.view(np.uint32), by_config.view(np.uint32)),
                        f"max difference {np.abs(by_script - by_config).max()}")
        unclipped = self.run_job("noclip", T, {})
        self.assertFalse(np.array_equal(by_script, unclipped))  # it did clip

    def test_with_a_deepspeed_configs_micro_batches(self):
        # gradient_accumulation_steps 2: step() after every micro-batch (DeepSpeed's
        # engine.step()), each pair of micro-batches one optimizer step, whose lr and
        # clipping are those given with its last micro-batch (before: silently the job's).
        # Each pair carries the same gradient, so the bits are the plain stream's.
        scheduled = self.run_job("lambdalr-micro", T, {"LR_ZERO_AFTER": "40"}, micro_batches=2)
        shorter = self.run_job("twenty-plain", 20, {})
        self.assertTrue(np.array_equal(scheduled.view(np.uint32), shorter.view(np.uint32)),
                        f"max difference {np.abs(scheduled - shorter).max()}")
        # DeepSpeed's loop has no zero_grad: backward adds to .grad, and each step() hands
        # over its micro-batch's own gradient (it clears .grad after taking it, as the
        # engine does). Before, the second micro-batch handed over the sum of both.
        accumulated = self.run_job("accumulate-micro", T,
                                   {"LR_ZERO_AFTER": "40", "BACKWARD_ACCUMULATES": "1"},
                                   micro_batches=2)
        self.assertTrue(np.array_equal(accumulated.view(np.uint32), shorter.view(np.uint32)),
                        f"max difference {np.abs(accumulated - shorter).max()}")
        by_script = self.run_job("clipscript-micro", T, {"CLIP_EACH_STEP": "0.05"},
                                 micro_batches=2)
        by_config = self.run_job("clipconfig-plain", T, {}, clipping=0.05)
        self.assertTrue(np.array_equal(by_script.view(np.uint32), by_config.view(np.uint32)),
                        f"max difference {np.abs(by_script - by_config).max()}")
        # A job without steps ends where the loops do: 40 micro-batches are step 20 (before:
        # the loop's end, counted in micro-batches, failed the job); a loop that ends inside
        # a step fails the job, saying so, and is not restarted (78).
        looped = self.run_job("loop-micro", None, {"LOOP_STEPS": "40"}, micro_batches=2)
        self.assertTrue(np.array_equal(looped.view(np.uint32), shorter.view(np.uint32)),
                        f"max difference {np.abs(looped - shorter).max()}")
        r = self.run_job("loop-half", None, {"LOOP_STEPS": "41"}, micro_batches=2,
                         expect_ok=False)
        self.assertEqual(r.returncode, 78, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertIn("the training loop ended after micro-batch 41, inside step 21 "
                      "(gradient_accumulation_steps = 2 micro-batches a step)",
                      r.stdout + r.stderr)

    @staticmethod
    def schedule_of(*lrs, decays=(0.0, 0.1)):
        """Param groups of these lrs and weight decays (lr 0.01, betas (0.9, 0.999) and eps
        1e-8 the job's), and the _Schedule of the optimizer built with them."""
        from onebit._groups import _Schedule
        groups = [{"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": decay}
                  for lr, decay in zip(lrs, decays)]
        return groups, _Schedule(groups, {"lr": 0.01, "betas": (0.9, 0.999)})

    def test_betas_move_together_and_eps_stays(self):
        groups, schedule = self.schedule_of(0.01, 0.01)
        self.assertIsNone(schedule.betas(groups, False))
        for g in groups:
            g["betas"] = (0.85, 0.99)
        self.assertEqual(schedule.betas(groups, False), (0.85, 0.99))
        with self.assertRaises(ValueError) as e:
            schedule.betas(groups, True)  # the job config's scheduler cycles the betas
        self.assertIn("the job config's scheduler cycles them: use one of the two",
                      str(e.exception))
        groups[1]["betas"] = (0.95, 0.99)
        with self.assertRaises(ValueError) as e:
            schedule.betas(groups, False)
        self.assertIn("every group steps with the same betas", str(e.exception))
        # A weight-decay schedule: each group's own, as written.
        self.assertIsNone(schedule.weight_decays(groups))
        groups[1]["weight_decay"] = 0.05
        self.assertEqual(schedule.weight_decays(groups), [0.0, 0.05])
        schedule.check_fixed(groups)  # weight_decay may move
        for bad in (-0.1, float("nan"), float("inf")):
            groups[0]["weight_decay"] = bad
            with self.assertRaises(ValueError) as e:
                schedule.weight_decays(groups)
            self.assertIn(f"param group 0's weight_decay is {bad}: it must be >= 0 and finite",
                          str(e.exception))
        groups[0]["eps"] = 1e-6
        with self.assertRaises(ValueError) as e:
            schedule.check_fixed(groups)
        self.assertIn("param group 0's eps went from 1e-08 to 1e-06: onebit fixes eps when "
                      "the optimizer is built", str(e.exception))

    def test_groups_must_move_together_and_not_beside_a_config_scheduler(self):
        groups, schedule = self.schedule_of(0.01, 0.02)
        self.assertIsNone(schedule.lr(groups, False))
        groups[0]["lr"], groups[1]["lr"] = 0.005, 0.01
        self.assertAlmostEqual(schedule.lr(groups, False), 0.005)
        groups[1]["lr"] = 0.02
        with self.assertRaises(ValueError) as e:
            schedule.lr(groups, False)
        self.assertIn("param group 1's lr went from 0.02 to 0.02", str(e.exception))
        with self.assertRaises(ValueError) as e:
            schedule.lr(groups, True)  # the job config has a scheduler
        self.assertIn("the job config has a scheduler: use one of the two", str(e.exception))


class Recovery(StreamCase):
    """A script killed mid-job: the launcher restarts it, every worker resumes from the
    job's last checkpoint (written by the Python workers' C++ side), and the result has the
    bits of an uninterrupted run."""

    def test_killed_and_resumed_from_the_checkpoint(self):
        tmp = tempfile.mkdtemp(prefix="killed-", dir=self.tmp)
        config = job_config("OneBitAdam", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10})
        config["onebit"]["checkpoint"] = {"dir": os.path.join(tmp, "ckpt"), "every_steps": 5}
        config["onebit"]["failure"] = {"max_restarts": 2, "heartbeat_timeout_s": 2,
                                       "gloo_timeout_s": 10, "rejoin_timeout_s": 60}
        os.environ["KILL_AT"] = "1:18:" + os.path.join(tmp, "killed")
        try:
            out = os.path.join(tmp, "package.npy")
            r = launch(tmp, config, [os.path.join(HERE, "stream_train.py"), "{config}",
                                     os.path.join(self.tmp, "params.npy"),
                                     os.path.join(self.tmp, "grads.npy"), out, "OneBitAdam"])
        finally:
            del os.environ["KILL_AT"]
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertTrue(os.path.exists(os.path.join(tmp, "killed")))
        with open(os.path.join(tmp, "out", "onebit_adam", "worker-1.log")) as f:
            log = f.read()
        self.assertIn("rank 1: killing itself before step 18", log)
        self.assertIn("resumed from the checkpoint of step 15", log)
        self.assertSameBits(np.load(out), self.replay(os.path.join(tmp, "replay.npy"),
                                                      ["--lr=0.01", "--eps=1e-8",
                                                       "--freeze-step=10"]))

    def test_killed_in_the_last_step_after_the_other_ran_it(self):
        """Worker 1 dies after the last step's exchange, before its checkpoint part is
        reported (onebit-launch --fault: ONEBIT_FAULT); worker 0 has run the step, and its
        last step() waits for the job's end, so the recovery restarts it too (75)."""
        tmp = tempfile.mkdtemp(prefix="killed-last-", dir=self.tmp)
        config = job_config("OneBitAdam", {"lr": 0.01, "eps": 1e-8, "freeze_step": 10})
        config["onebit"]["checkpoint"] = {"dir": os.path.join(tmp, "ckpt"), "every_steps": 10}
        config["onebit"]["failure"] = {"max_restarts": 2, "heartbeat_timeout_s": 2,
                                       "gloo_timeout_s": 10, "rejoin_timeout_s": 60}
        out = os.path.join(tmp, "package.npy")
        r = launch(tmp, config, [os.path.join(HERE, "stream_train.py"), "{config}",
                                 os.path.join(self.tmp, "params.npy"),
                                 os.path.join(self.tmp, "grads.npy"), out, "OneBitAdam"],
                   launcher_args=[f"--fault=worker1:kill_before_commit:{T}"])
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        self.assertIn("worker 0 exited with code 75; restarting it", r.stdout + r.stderr)
        with open(os.path.join(tmp, "out", "onebit_adam", "worker-0.log")) as f:
            log = f.read()
        self.assertIn(f"resumed from the checkpoint of step {T - 10}", log)
        self.assertSameBits(np.load(out), self.replay(os.path.join(tmp, "replay.npy"),
                                                      ["--lr=0.01", "--eps=1e-8",
                                                       "--freeze-step=10"]))


class CodeDigest(unittest.TestCase):
    """What rank 0's coordinator counts as the job's code (a failed job stays failed for the
    same config and code): the script and the modules it imported from its own directory
    tree; not the packages installed there (a venv), not files it never imported."""

    def test_the_script_and_its_own_modules(self):
        root = tempfile.mkdtemp(prefix="onebit-digest-")
        files = {
            "train.py": "import helper, models.net, dep\nimport onebit.torch\n"
                        "from onebit._job import _code_digest\nprint(_code_digest())\n",
            "helper.py": "X = 1\n",
            "models/__init__.py": "",
            "models/net.py": "Y = 2\n",
            "unused.py": "Z = 3\n",
            ".venv/lib/python3.11/site-packages/dep.py": "W = 4\n",
        }
        for name, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
            with open(os.path.join(root, name), "w") as f:
                f.write(text)
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONPATH=os.pathsep.join(
            [os.path.join(root, ".venv/lib/python3.11/site-packages"), os.path.dirname(HERE),
             os.path.join(BIN, "python")]))

        def digest():
            r = subprocess.run([sys.executable, os.path.join(root, "train.py")], env=env,
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stdout.strip(), r"^[0-9a-f]{64}$")
            return r.stdout.strip()

        def edit(name):
            with open(os.path.join(root, name), "a") as f:
                f.write("# edited\n")

        first = digest()
        self.assertEqual(digest(), first)
        seen = {first}
        for name in ("helper.py", "models/net.py", "train.py"):
            edit(name)
            now = digest()
            self.assertNotIn(now, seen, f"an edit of {name} left the digest as it was")
            seen.add(now)
        last = now
        for name in ("unused.py", ".venv/lib/python3.11/site-packages/dep.py"):
            edit(name)
            self.assertEqual(digest(), last, f"an edit of {name} changed the digest")


class BadInput(unittest.TestCase):
    """Refused before anything starts, with a clear Python exception."""

    def tearDown(self):
        # One optimizer at a time per process: the ones a test built (never joined) end here.
        from onebit._processes import _BUILT
        for opt in list(_BUILT):
            if not (opt._closed or opt._done):
                opt.close("the test is over")

    def make(self, params, config=None):
        import onebit.torch as ot
        cfg = config or job_config("OneBitAdam", {"lr": 0.001})
        return ot.OneBitAdam(params, cfg, coordinator="127.0.0.1:1")

    def assertRefused(self, params, text, config=None, error=ValueError):
        with self.assertRaises(error) as e:
            self.make(params, config)
        self.assertIn(text, str(e.exception))

    def test_parameters(self):
        p = torch.nn.Parameter(torch.zeros(4, 4))
        self.assertRefused([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))], "float32")
        self.assertRefused([torch.nn.Parameter(torch.zeros(4, 4).t())], "not contiguous")
        self.assertRefused([torch.zeros(3)], "no parameter requires a gradient (1 left out")
        self.assertRefused([("layer.w", torch.nn.Parameter(torch.zeros(4, 4).t()))],
                           "parameter 'layer.w' ((4, 4)) is not contiguous")
        self.assertRefused([torch.nn.Parameter(torch.zeros(3).to_sparse())], "sparse")
        self.assertRefused([], "empty parameter list", error=ValueError)
        self.assertRefused([p], "job config's optimizer is OneBitLamb",
                           config=job_config("OneBitLamb", {"lr": 0.001}))
        self.assertRefused([{"params": [p], "betas": (0.8, 0.999)}], "param group 0 sets betas")
        self.assertRefused([{"params": [p], "eps": 1e-3}], "param group 0 sets eps")
        self.assertRefused([{"params": [p], "weight_decay": -1.0}], "weight_decay must be >= 0")

    def test_a_steps_inputs_are_checked_where_they_cross_into_the_core(self):
        from onebit import _native
        w = _native.Worker("/nonexistent.json", "127.0.0.1:1", torch.zeros(4), [0, 4])
        with self.assertRaises(ValueError) as e:
            w.supply(1, betas=(0.9,))
        self.assertIn("betas must be a pair (beta1, beta2), got (0.9,)", str(e.exception))
        with self.assertRaises(ValueError) as e:
            w.supply(1, lr="fast")
        self.assertIn("could not convert string to float: 'fast'", str(e.exception))
        # Well formed: the core takes them, and answers that this worker never started.
        with self.assertRaises(RuntimeError) as e:
            w.supply(1, loss=0.5, lr=0.1, max_grad_norm=1.0, betas=(0.9, 0.999),
                     weight_decays=[0.0], grad_scale=1.0)
        self.assertIn("the worker is not running", str(e.exception))

    def test_momentum_masks(self):
        w = torch.nn.Parameter(torch.zeros(4, 3))
        self.assertRefused([{"params": [("emb", w)], "exp_avg_mask": torch.ones(5, 1)}],
                           "param group 0's exp_avg_mask has shape (5, 1), which does not fit "
                           "parameter 'emb' ((4, 3))")
        self.assertRefused([{"params": [w], "exp_avg_mask": torch.full((4, 1), 0.5)}],
                           "exp_avg_mask holds 0.5 for element 0 of parameter 0 ((4, 3)): a "
                           "momentum mask is 0 (masked) or 1")
        scattered = torch.arange(2 * 10001) % 2
        self.assertRefused([{"params": [torch.nn.Parameter(torch.zeros(2 * 10001))],
                             "exp_avg_mask": scattered}],
                           "masks 10001 separate runs of elements, more than the 10000")
        npy = job_config("OneBitAdam", {"lr": 0.001})
        npy["onebit"]["momentum_mask"] = {"npy": "mask.npy"}
        self.assertRefused([{"params": [w], "exp_avg_mask": torch.tensor([[1.], [0], [1], [1]])}],
                           "exp_avg_mask and the job config's onebit.momentum_mask.npy",
                           config=npy)

    def test_a_missing_library_names_its_debian_package(self):
        from onebit._core import _missing_library_hint
        hint = _missing_library_hint(
            "libgloo.so.0: cannot open shared object file: No such file or directory")
        self.assertEqual(hint, "libgloo.so.0 is missing: apt-get install libgloo0")
        self.assertIn("NCCL 2", _missing_library_hint(
            "libnccl.so.2: cannot open shared object file: No such file or directory"))
        self.assertIsNone(_missing_library_hint("No module named '_onebit_core'"))

    def test_a_lenient_config_file(self):
        # Comments and trailing commas, as DeepSpeed's files have them; a string that looks
        # like one stays as it is.
        import onebit.torch as ot
        path = os.path.join(tempfile.mkdtemp(prefix="onebit-lenient-"), "job.json")
        with open(path, "w") as f:
            f.write('{"steps": 7, // seven\n /* the data */ "onebit": {"workload": '
                    '{"data_dir": "/x, } // y",},},}')
        self.assertEqual(ot.load_config(path),
                         {"steps": 7, "onebit": {"workload": {"data_dir": "/x, } // y"}}})

    def test_keywords(self):
        import onebit.torch as ot
        p = [torch.nn.Parameter(torch.zeros(2))]
        with self.assertRaises(TypeError) as e:
            ot.OneBitAdam(p, lr=1e-3, var_freeze_step=5, coordinator="127.0.0.1:1")
        self.assertIn("unexpected keyword argument(s) var_freeze_step", str(e.exception))
        with self.assertRaises(ValueError) as e:  # the C++ parser names the key
            ot.OneBitAdam(p, eps=-1.0, coordinator="127.0.0.1:1")
        self.assertEqual("OneBitAdam: optimizer.params.eps: must be in (0, 1], got -1",
                         str(e.exception))
        with self.assertRaises(TypeError):
            ot.OneBitAdam(p, job_config("OneBitAdam", {}), config={})
        with self.assertRaises(ValueError) as e:  # the decay is AdamW's, as DeepSpeed's
            ot.OneBitAdam(p, weight_decay=0.01, decoupled_weight_decay=False,
                          coordinator="127.0.0.1:1")
        self.assertIn("onebit's weight decay is decoupled, as AdamW's", str(e.exception))

    def test_overlap_needs_a_warmup_between_the_workers(self):
        # The C++ config decides where the warmup goes (WarmupBetweenWorkers); overlap asked
        # for elsewhere is refused before anything starts, naming the way out.
        import onebit.torch as ot
        p = [torch.nn.Parameter(torch.zeros(N))]

        def refused(exchange, text, **kw):
            cfg = job_config("OneBitAdam", {"lr": 0.001})
            cfg["onebit"]["exchange"] = exchange
            with self.assertRaises(ValueError) as e:
                ot.OneBitAdam(p, cfg, coordinator="127.0.0.1:1", **kw)
            self.assertIn(text, str(e.exception))

        through_shards = ('overlap needs a warmup between the workers: onebit.exchange.mode '
                          '"peer", or "ps" with warmup_over "workers", not "ps" with its '
                          'warmup through the shards: build the optimizer with overlap=False')
        refused({"mode": "ps", "servers": 1}, through_shards, overlap=True)
        refused({"mode": "ps", "servers": 1, "warmup_over": "shards"}, through_shards,
                overlap=True)
        refused({"mode": "hierarchical", "local_size": 2}, 'not "hierarchical"', overlap=True)
        refused({"mode": "peer", "overlap": True}, "overlap=False while the job config's "
                "onebit.exchange.overlap is True", overlap=False)
        # The config's own errors still name the key, from the C++ parser.
        refused({"mode": "ps", "servers": 0}, "OneBitAdam: onebit.exchange.servers")
        # fp16 loss scaling agrees on overflows before the warmup exchange can start.
        cfg = job_config("OneBitAdam", {"lr": 0.001})
        cfg["fp16"] = {"enabled": True}
        with self.assertRaises(ValueError) as e:
            ot.OneBitAdam(p, cfg, coordinator="127.0.0.1:1", overlap=True)
        self.assertIn("overlap with fp16 loss scaling", str(e.exception))
        # Nor with a DeepSpeed config's micro-batches (averaged before the exchange).
        cfg = job_config("OneBitAdam", {"lr": 0.001})
        cfg["gradient_accumulation_steps"] = 2
        with self.assertRaises(ValueError) as e:
            ot.OneBitAdam(p, cfg, coordinator="127.0.0.1:1", overlap=True)
        self.assertIn("overlap with gradient_accumulation_steps 2", str(e.exception))
        self.assertIsNone(ot.OneBitAdam(p, cfg, coordinator="127.0.0.1:1")._gradients.overlap)

    def test_a_param_group_added_after_construction(self):
        # torch.optim takes it; here it would never train (the flat buffer is sized at
        # construction): refused, naming why.
        import onebit.torch as ot
        opt = ot.OneBitAdam([{"params": [torch.nn.Parameter(torch.zeros(N))]}],
                            job_config("OneBitAdam", {}), coordinator="127.0.0.1:1")
        # Cast after construction, before the first step, to a type onebit does not train:
        # refused when it would join (before, the values went to the C++ side).
        opt.param_groups[0]["params"][0].data = torch.zeros(N, dtype=torch.float64)
        with self.assertRaises(ValueError) as e:
            opt.step()
        self.assertIn("parameter 0 ((%d,)) is torch.float64" % N, str(e.exception))
        with self.assertRaises(ValueError) as e:
            opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
        self.assertIn("add_param_group after the optimizer was built", str(e.exception))
        self.assertEqual(len(opt.param_groups), 1)

    def test_an_old_grad_scaler_handing_itself_over_is_refused(self):
        # torch < 2.1's GradScaler hands itself to step() (the optimizer says it supports amp
        # scaling): refused, before any exchange, naming what works (torch.amp.GradScaler,
        # GradScalerLikeTorch, or the fp16 block).
        import onebit.torch as ot
        opt = ot.OneBitAdam([torch.nn.Parameter(torch.zeros(N))], job_config("OneBitAdam", {}),
                            coordinator="127.0.0.1:1")
        self.assertTrue(opt._step_supports_amp_scaling)
        with self.assertRaises(ValueError) as e:
            opt.step(grad_scaler=torch.cuda.amp.GradScaler(enabled=False))
        self.assertIn("onebit works with torch.amp.GradScaler of torch >= 2.1", str(e.exception))

    def test_a_world_size_that_disagrees_with_the_config(self):
        import onebit.torch as ot
        env = {"WORLD_SIZE": "3", "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            with self.assertRaises(ValueError) as e:
                ot.OneBitAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3,
                              config={"onebit": {"workers": 2}})
            self.assertIn("onebit.workers = 2, the launcher started 3 workers", str(e.exception))
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)

    def test_an_embedded_coordinator_whose_port_is_taken(self):
        import socket
        import onebit.torch as ot
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen(1)
            port = taken.getsockname()[1]
            env = {"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(port - 1)}
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                with self.assertRaises(ot.OnebitError) as e:
                    ot.OneBitAdam([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
                self.assertIn(f"could not start the job's coordinator on 127.0.0.1:{port} "
                              "(MASTER_PORT + 1)", str(e.exception))
            finally:
                for k, v in saved.items():
                    os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


class EnvContract(unittest.TestCase):
    """Where a process stands, from torchrun's, Slurm's or onebit's variables."""

    def test_precedence_and_defaults(self):
        from onebit import env
        self.assertEqual((env.rank({}), env.world_size({}), env.local_rank({}),
                          env.local_world_size({})), (0, 1, 0, 1))
        torchrun = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}
        self.assertEqual((env.rank(torchrun), env.world_size(torchrun), env.local_rank(torchrun),
                          env.local_world_size(torchrun)), (3, 8, 1, 2))
        slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2",
                 "SLURM_TASKS_PER_NODE": "3(x2)"}
        self.assertEqual((env.rank(slurm), env.world_size(slurm), env.local_rank(slurm),
                          env.local_world_size(slurm)), (5, 6, 2, 3))
        both = {**slurm, **torchrun, "ONEBIT_RANK": "7"}
        self.assertEqual((env.rank(both), env.world_size(both)), (7, 8))  # onebit, then torchrun
        with self.assertRaises(ValueError) as e:
            env.rank({"RANK": "zero"})
        self.assertIn("$RANK is 'zero'", str(e.exception))

    def test_the_launchers_restarts_are_the_jobs_at_least(self):
        # torchrun --max_restarts K sets TORCHELASTIC_MAX_RESTARTS: a config without
        # failure.max_restarts keeps max(K, the default 3); a config's own value stands.
        from onebit._job import _job_config
        def failure(job, launcher):
            with mock.patch.dict(os.environ):
                os.environ.pop("TORCHELASTIC_MAX_RESTARTS", None)
                if launcher is not None:
                    os.environ["TORCHELASTIC_MAX_RESTARTS"] = launcher
                full = _job_config(json.loads(json.dumps(job)), "OneBitAdam", {}, 10, "cpu")
                return full["onebit"].get("failure")
        from onebit import env
        self.assertEqual((env.restart_count({}), env.max_restarts({})), (0, None))
        launched = {"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "5"}
        self.assertEqual((env.restart_count(launched), env.max_restarts(launched)), (2, 5))
        self.assertEqual(failure({}, "7"), {"max_restarts": 7})
        self.assertEqual(failure({}, "1"), {"max_restarts": 3})
        self.assertIsNone(failure({}, None))  # the config's default applies
        given = {"onebit": {"failure": {"max_restarts": 2, "heartbeat_timeout_s": 4}}}
        self.assertEqual(failure(given, "7"), {"max_restarts": 2, "heartbeat_timeout_s": 4})
        other = {"onebit": {"failure": {"heartbeat_timeout_s": 4}}}
        self.assertEqual(failure(other, "7"), {"max_restarts": 7, "heartbeat_timeout_s": 4})

    def test_slurm_node_lists(self):
        from onebit import env
        self.assertEqual(env.first_slurm_host("node[03-05,7],gpu1"), "node03")
        self.assertEqual(env.first_slurm_host("gpu1,node[1-2]"), "gpu1")
        self.assertEqual(env.first_slurm_host("solo"), "solo")

    def test_rendezvous(self):
        from onebit import env
        r = env.rendezvous(environ={"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                    "MASTER_PORT": "40000"})
        self.assertTrue(r.embedded)
        self.assertEqual((r.coordinator, r.bind_host, r.grpc_port, r.rest_port),
                         ("127.0.0.1:40001", "127.0.0.1", 40001, 40002))
        r = env.rendezvous(environ={"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})
        self.assertFalse(r.embedded)
        self.assertEqual(r.coordinator, "127.0.0.1:29501")  # torchrun's default port + 1
        r = env.rendezvous(environ={"SLURM_PROCID": "0", "SLURM_NTASKS": "4",
                                    "SLURM_JOB_NODELIST": "localhost", "MASTER_PORT": "1000"})
        self.assertEqual((r.embedded, r.coordinator), (True, "localhost:1001"))
        r = env.rendezvous(environ={"RANK": "0", "WORLD_SIZE": "2",
                                    "ONEBIT_COORDINATOR": "coord:7000"})
        self.assertEqual((r.embedded, r.coordinator), (False, "coord:7000"))
        # Another port where MASTER_PORT + 1 is taken; never the store's (MASTER_PORT).
        r = env.rendezvous(environ={"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                    "MASTER_PORT": "40000", "ONEBIT_COORDINATOR_PORT": "41000"})
        self.assertEqual((r.coordinator, r.rest_port), ("127.0.0.1:41000", 41001))
        for bad in ("40000", "39999", "x", "65535"):
            with self.assertRaises(ValueError):
                env.rendezvous(environ={"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "40000",
                                        "ONEBIT_COORDINATOR_PORT": bad})
        r = env.rendezvous(environ={})  # one process alone: any free port
        self.assertEqual((r.embedded, r.grpc_port), (True, 0))
        with self.assertRaises(ValueError):
            env.rendezvous(environ={"WORLD_SIZE": "2", "MASTER_PORT": "65535"})


def free_port_run(count):
    """A port p with p .. p + count - 1 free a moment ago (onebit-run's own choice)."""
    from onebit.run import free_port_run as run  # noqa: PLC0415
    return run("127.0.0.1", count)


class LaunchedLikeTorchrun(StreamCase):
    """No onebit-launch and no coordinator process: W copies of a script with the variables
    torchrun sets (Debian's torchrun fails at start on these machines, so the test sets them
    as torchrun would), or Slurm's srun. Rank 0 runs the coordinator inside its process; the
    optimizer is built with keyword arguments and a config without an optimizer block; the
    result has the bits of onebit-replay."""

    CONFIG = {"train_micro_batch_size_per_gpu": 1, "steps": T, "seed": 1,
              "onebit": {"exchange": {"mode": "peer"}, "log_every": 10,
                         "failure": {"max_restarts": 0, "heartbeat_timeout_s": 5}}}
    KWARGS = {"lr": 0.01, "eps": 1e-8, "weight_decay": 0.001, "freeze_step": 10,
              "bias_correction": False}

    def script_env(self, **extra):
        """stream_train.py's environment: no launcher's variables but `extra`, the
        optimizer built from KWARGS, the package and its extension on the path."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ONEBIT_", "SLURM_")) and
               k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        env.update(OPT_KWARGS=json.dumps(self.KWARGS),
                   PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), os.path.join(BIN, "python")]),
                   **extra)
        return env

    def run_ranks(self, name, env_of_rank, extra_env=None, config_dict=None, expect_ok=True,
                  script=os.path.join(HERE, "stream_train.py")):
        tmp = tempfile.mkdtemp(prefix=name + "-", dir=self.tmp)
        config = os.path.join(tmp, "job.json")
        with open(config, "w") as f:
            json.dump(config_dict or self.CONFIG, f)
        out = os.path.join(tmp, "package.npy")
        procs = []
        for r in range(W):
            env = self.script_env(**env_of_rank(r))
            env.update((extra_env or {}) if not callable(extra_env) else extra_env(r))
            log = open(os.path.join(tmp, f"rank-{r}.log"), "w")
            procs.append((subprocess.Popen(
                [sys.executable, script, config,
                 os.path.join(self.tmp, "params.npy"), os.path.join(self.tmp, "grads.npy"), out,
                 "OneBitAdam"], env=env, stdout=log, stderr=subprocess.STDOUT), log))
        logs = []
        self.returncodes = []
        for p, log in procs:
            try:
                p.wait(timeout=180)
            finally:
                if p.poll() is None:
                    p.kill()
                log.close()
            with open(log.name) as f:
                logs.append(f.read())
            self.returncodes.append(p.returncode)
            if expect_ok:
                self.assertEqual(p.returncode, 0, logs[-1][-3000:])
        if not expect_ok:
            return logs
        self.assertSameBits(np.load(out), self.replay(
            os.path.join(tmp, "replay.npy"),
            ["--lr=0.01", "--eps=1e-8", "--weight-decay=0.001", "--freeze-step=10"]))
        return logs

    def test_torchrun_environment(self):
        port = free_port_run(3)
        logs = self.run_ranks("torchrun", lambda r: {
            "RANK": str(r), "WORLD_SIZE": str(W), "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": str(W), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)},
            extra_env={"ALSO_TORCH_DISTRIBUTED": "1"})
        for r, log in enumerate(logs):
            self.assertIn(f"before the optimizer: rank {r} of {W}, local rank {r} of {W}", log)
            # The script's own torch.distributed on MASTER_PORT works beside onebit's.
            self.assertIn(f"torch.distributed all_reduce: {sum(range(1, W + 1))}", log)
            # dist.init_process_group() and DistributedSampler(ds) with no arguments.
            self.assertIn(f"DistributedSampler: rank {r} of {W}", log)
        # DDP-quiet: rank 0 prints progress; the others neither progress nor start-up lines
        # (before: every rank, every log_every steps).
        self.assertRegex(logs[0], r"rank 0  step \d+/\d+ ")
        for line in ("  step ", "worker rank 1 of", "/metrics, /healthz"):
            self.assertNotIn(line, logs[1])
        self.assertIn(f"serving gRPC on 127.0.0.1:{port + 1}", logs[0])  # rank 0's coordinator

    def torchrun_env(self, port):
        return lambda r: {"RANK": str(r), "WORLD_SIZE": str(W), "LOCAL_RANK": str(r),
                          "LOCAL_WORLD_SIZE": str(W), "MASTER_ADDR": "127.0.0.1",
                          "MASTER_PORT": str(port)}

    def test_a_shard_on_each_node(self):
        # exchange.servers "per_node": two nodes of one worker each, so local rank 0 of each
        # runs a shard (2 shards = W: peer mode's bits), without a shard process to start.
        config = json.loads(json.dumps(self.CONFIG))
        config["onebit"]["exchange"] = {"mode": "ps", "servers": "per_node"}
        port = free_port_run(3)
        two_nodes = lambda r: dict(self.torchrun_env(port)(r), LOCAL_RANK="0",  # noqa: E731
                                   LOCAL_WORLD_SIZE="1")
        logs = self.run_ranks("per-node", two_nodes, config_dict=config)
        for r in range(W):
            self.assertIn(f"this node's shard {r} runs as process", logs[r])
            self.assertIn(f"onebit-server: shard {r} of {W}, {W} workers, n = {N}", logs[r])
        # Shards beside the workers: the warmup goes between the workers by default.
        self.assertIn(f"{W} servers (the warmup between the workers)", logs[0])

    def test_a_job_without_steps_ends_when_the_loops_do(self):
        # No steps anywhere: each script runs a plain loop of T steps and closes; the job
        # ends after step T with onebit-replay's bits for T steps.
        config = {k: v for k, v in self.CONFIG.items() if k != "steps"}
        logs = self.run_ranks("open", self.torchrun_env(free_port_run(3)),
                              extra_env={"LOOP_STEPS": str(T)}, config_dict=config)
        # Whichever worker tells the coordinator first ends the job there; the other's
        # lease then stops after that step (so either log may say it).
        # (Rank 1 prints no progress under torchrun's variables: the coordinator's line
        # then names it.)
        self.assertRegex(logs[0] + logs[1], rf"(the|worker \d's) training loop ended after "
                                            rf"step {T}: the job ends there")
        self.assertIn("job succeeded", logs[0])

    def test_a_loop_that_runs_past_the_others_is_told_where_the_job_ended(self):
        config = {k: v for k, v in self.CONFIG.items() if k != "steps"}
        logs = self.run_ranks("uneven", self.torchrun_env(free_port_run(3)),
                              extra_env=lambda r: {"LOOP_STEPS": str(12 + 3 * r)},
                              config_dict=config, expect_ok=False)
        # Worker 0's loop ends after step 12; worker 1 is then in step 13's exchange.
        self.assertIn("the training loop ended after step 12: the job ends there", logs[0])
        self.assertIn("the job ended after step 12 while this worker still ran: its training "
                      "loop ran past the others'", logs[1])
        # The script's exception says so too, not only the broken connection it met.
        self.assertIn("OnebitError: onebit worker stopped: the job ended after step 12 while "
                      "this worker still ran", logs[1])

    def test_ranks_that_step_with_another_lr_fail_the_job(self):
        # Rank 1's lr halves at step 4, rank 0's does not (as ReduceLROnPlateau on each
        # rank's own loss would): the replicas would train apart without a word. The job
        # fails at the next step both reported (10: log_every), naming both lrs.
        logs = self.run_ranks("rank-lr", self.torchrun_env(free_port_run(3)),
                              extra_env={"RANK_LR": "1:4:0.005"}, expect_ok=False)
        self.assertRegex(logs[0], r"job FAILED: worker \d stepped step 10 with other "
                                  r"hyperparameters than worker \d \(lr 0\.0(05|1) against "
                                  r"0\.0(1|05)\)")
        self.assertIn("ReduceLROnPlateau on its own loss", logs[1])

    def test_a_rank_whose_coordinator_died_with_rank_0_exits_in_bounded_time(self):
        # No launcher stops rank 1 when rank 0, which runs the coordinator, is SIGKILLed.
        # Before, rank 1's step failed and its verdict asked the dead coordinator with the
        # client's whole retry budget a call (failure.coordinator_retry_s, 120 s), for
        # minutes; now it exits 75 (restart me) once its session counts the coordinator
        # gone (half the heartbeat timeout, 5 s here).
        marker = os.path.join(tempfile.mkdtemp(dir=self.tmp), "killed")
        start = time.monotonic()
        logs = self.run_ranks("rank0-killed-alone", self.torchrun_env(free_port_run(3)),
                              extra_env={"KILL_AT": f"0:13:{marker}"}, expect_ok=False)
        self.assertLess(time.monotonic() - start, 60, logs[1][-2000:])
        self.assertIn("exiting with 75 to be restarted", logs[1])

    def test_a_script_that_raises_is_a_failure_not_the_end_of_the_loop(self):
        # No steps: before, rank 1's exception ended its loop like a `break`, the job
        # "succeeded" after step 12, and rank 0 was told its loop ran past the others'. Now
        # rank 1 tells the coordinator at once why it stops, and rank 0 hears that (with
        # max_restarts 0 the recovery fails the job) instead of a broken connection.
        # The job's failure is an OnebitError in rank 0's script too (before: the worker's
        # std::_Exit(78) from C++, and no finally block, atexit handler or buffered file of
        # the script's ran there): its finally runs, and the uncaught error exits 78.
        config = {k: v for k, v in self.CONFIG.items() if k != "steps"}
        here = tempfile.mkdtemp(dir=self.tmp)
        marker, finally_file = os.path.join(here, "raised"), os.path.join(here, "finally")
        logs = self.run_ranks("raised-open", self.torchrun_env(free_port_run(3)),
                              extra_env={"KILL_AT": f"1:13:{marker}", "RAISE_INSTEAD": "1",
                                         "FINALLY_FILE": finally_file},
                              config_dict=config, expect_ok=False)
        self.assertEqual(self.returncodes[0], 78, logs[0][-3000:])
        self.assertIn("onebit.torch.OnebitError: onebit worker stopped: ", logs[0])
        for r in range(W):
            self.assertTrue(os.path.exists(f"{finally_file}-{r}"), f"rank {r}: {logs[r][-2000:]}")
        reason = ("worker 1 ({}) failed in step 13, which a restart may fix: the script raised "
                  "RuntimeError: rank 1: an error of the script's before step 13")
        self.assertRegex(logs[0], re.escape(reason).replace(re.escape("{}"), "[^)]+") +
                         re.escape("; no recovery left"))
        self.assertIn("exiting with 78 (do not restart)", logs[0])
        for log in logs:
            self.assertNotIn("job succeeded", log)
            self.assertNotIn("the job ends there", log)

    def run_restarted(self, name, checkpoint, kill_at, extra_env=None, nodes=1):
        """onebit-run --max_restarts=5 (torchrun's flag) over W processes of stream_train.py
        (on one node, or one a node, each node's onebit-run restarting only its own), one of
        which kills itself once (KILL_AT): what the onebit-runs printed, and each rank's log.
        """
        tmp = tempfile.mkdtemp(prefix=name + "-", dir=self.tmp)
        config = json.loads(json.dumps(self.CONFIG))
        # No failure.max_restarts: the launcher's count is the job's (at least 3).
        config["onebit"]["failure"] = {"heartbeat_timeout_s": 2, "gloo_timeout_s": 10}
        if checkpoint:
            # A directory that does not exist yet: the coordinator makes it.
            config["onebit"]["checkpoint"] = {"dir": os.path.join(tmp, "new", "ckpt"),
                                              "every_steps": 5}
        path = os.path.join(tmp, "job.json")
        with open(path, "w") as f:
            json.dump(config, f)
        env = self.script_env(KILL_AT=f"{kill_at}:{tmp}/killed", **(extra_env or {}))
        out = os.path.join(tmp, "package.npy")
        port = free_port_run(3)
        runs = [subprocess.Popen(
            [sys.executable, "-m", "onebit.run", f"--nproc_per_node={W // nodes}",
             f"--nnodes={nodes}", f"--node_rank={node}", f"--master_port={port}",
             "--max_restarts=5", "--log_dir=" + tmp, os.path.join(HERE, "stream_train.py"),
             path, os.path.join(self.tmp, "params.npy"), os.path.join(self.tmp, "grads.npy"),
             out, "OneBitAdam"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True) for node in range(nodes)]
        printed = ""
        for run in runs:
            try:
                printed += run.communicate(timeout=240)[0]
            finally:
                if run.poll() is None:
                    run.kill()
        logs = []
        for rank in range(W):
            with open(os.path.join(tmp, f"rank-{rank}.log")) as f:
                logs.append(f.read())
        self.assertEqual([run.returncode for run in runs], [0] * nodes,
                         printed + logs[0][-3000:] + logs[1][-3000:])
        self.assertIn("onebit-run: restart 1 of at most 5", printed)
        self.assertSameBits(np.load(out), self.replay(
            os.path.join(tmp, "replay.npy"),
            ["--lr=0.01", "--eps=1e-8", "--weight-decay=0.001", "--freeze-step=10"]))
        return printed, logs

    def test_the_launchers_restart_resumes_after_rank_0_died(self):
        # Rank 0 runs the coordinator: killed in the compression stage, the group restarts,
        # the new coordinator reads the job's state in checkpoint.dir and every worker
        # resumes from the checkpoint of step 15.
        printed, logs = self.run_restarted("rank0-killed", checkpoint=True, kill_at="0:18")
        self.assertIn("onebit-run: rank 0 was killed by SIGKILL; restarting the group", printed)
        self.assertIn("rank 0: killing itself before step 18", logs[0])
        self.assertIn("recovering in generation 2 (recovery 1 of at most 5)", logs[0])
        for log in logs:
            self.assertIn("resumed from the checkpoint of step 15", log)

    def test_an_exception_in_rank_0s_script_is_recovered_like_a_lost_process(self):
        # Before: rank 0's exit failed the job for good ("the training loop is shorter than
        # the job"), so the restarted group exited 78 at once.
        printed, logs = self.run_restarted("rank0-raised", checkpoint=True, kill_at="0:18",
                                           extra_env={"RAISE_INSTEAD": "1"})
        self.assertIn("recovery 1 of at most 5: rank 0, which runs the job's coordinator, "
                      "stopped: the script raised RuntimeError: rank 0: an error of the "
                      "script's before step 18", logs[0])
        # The restarted coordinator goes on with that recovery: one failure counts once
        # against failure.max_restarts (before: the restart was recovery 2).
        self.assertIn("recovering in generation 3 (recovery 1 of at most 5, which the last "
                      "coordinator began)", logs[0])
        self.assertNotIn("recovery 2", logs[0])
        for log in logs:
            self.assertIn("resumed from the checkpoint of step 15", log)

    def test_rank_0_in_a_with_block_keeps_a_job_whose_peer_died(self):
        # A node each: rank 1 is killed and only its node restarts it, so rank 0 hears of
        # the loss in its step() inside `with opt:`. Before: the with block's close failed
        # the job for good (rank 0 runs the coordinator), and no restart could resume it.
        printed, logs = self.run_restarted("rank1-killed-with", checkpoint=True, kill_at="1:18",
                                           extra_env={"WITH_BLOCK": "1"}, nodes=2)
        self.assertIn("onebit-run: rank 1 was killed by SIGKILL; restarting the group", printed)
        self.assertNotIn("FAILED", logs[0])
        for log in logs:
            self.assertIn("resumed from the checkpoint of step 15", log)

    def test_the_launchers_restart_without_a_checkpoint_dir_starts_again(self):
        printed, logs = self.run_restarted("rank1-killed", checkpoint=False, kill_at="1:18")
        self.assertIn("onebit-run: rank 1 was killed by SIGKILL; restarting the group", printed)
        self.assertIn("the launcher's restart 1, and the job has no onebit.checkpoint.dir to "
                      "resume from: it starts again at step 1", logs[0])
        self.assertNotIn("resumed from the checkpoint", logs[1])

    def test_a_loop_shorter_than_the_job_on_another_rank_fails_it_at_once(self):
        # Rank 1's loop ends after step 12 of the job's 30 (a plain loop, then close): a
        # restart would end it there again, so the job fails at once, naming it, and rank 0
        # exits 78 (before: a recovery, repeated by every restart up to max_restarts).
        logs = self.run_ranks("short-rank1", self.torchrun_env(free_port_run(3)),
                              extra_env=lambda r: {"LOOP_STEPS": "12"} if r == 1 else {},
                              expect_ok=False)
        self.assertRegex(logs[0], r"job FAILED: worker 1 \(\S+\) failed in step 12, which no "
                                  r"restart fixes: the script closed the optimizer after step "
                                  r"12 of the job's 30 \(onebit.steps\): the training loop is "
                                  r"shorter than the job")
        self.assertIn("exiting with 78 (do not restart)", logs[0])
        self.assertNotIn("recovery 1", logs[0])

    def test_a_failed_job_stays_failed_until_the_script_changes(self):
        # The state file keeps a failed job for a launch with the same config and script (a
        # launcher's restart, which cannot fix it); an edited script is the fix: a new job.
        config = json.loads(json.dumps(self.CONFIG))
        config["onebit"]["checkpoint"] = {"dir": os.path.join(self.tmp, "failed-ckpt"),
                                          "every_steps": 10}
        short = lambda r: {"LOOP_STEPS": "12"} if r == 1 else {}  # noqa: E731
        self.run_ranks("failed-1", self.torchrun_env(free_port_run(3)), extra_env=short,
                       config_dict=config, expect_ok=False)
        logs = self.run_ranks("failed-2", self.torchrun_env(free_port_run(3)),
                              config_dict=config, expect_ok=False)
        self.assertIn("FAILED before this coordinator started, and a restart cannot fix it: "
                      "worker 1", logs[0])
        self.assertIn("failed with this config and script: it stays failed", logs[0])
        fixed = os.path.join(self.tmp, "stream_train_fixed.py")
        with open(os.path.join(HERE, "stream_train.py")) as f, open(fixed, "w") as out:
            out.write(f.read() + "\n# the loop runs every step now\n")
        logs = self.run_ranks("failed-3", self.torchrun_env(free_port_run(3)),
                              config_dict=config, script=fixed)
        self.assertRegex(logs[0], r"job \S+ failed \(worker 1 \(\S+\) failed in step 12, "
                                  r"which no restart fixes: .*\); with another config or script "
                                  r"this is a new job")
        # It resumes from the failed job's last checkpoint (onebit.checkpoint.resume).
        self.assertIn("resuming from the checkpoint of step 10", logs[0])

    def test_slurm_environment(self):
        port = free_port_run(3)
        logs = self.run_ranks("slurm", lambda r: {
            "SLURM_PROCID": str(r), "SLURM_NTASKS": str(W), "SLURM_LOCALID": str(r),
            "SLURM_TASKS_PER_NODE": f"{W}", "SLURM_JOB_NODELIST": "localhost",
            "MASTER_PORT": str(port)})
        for r, log in enumerate(logs):
            self.assertIn(f"before the optimizer: rank {r} of {W}, local rank {r} of {W}", log)


# The two-layer model's loop, where rank 1 does something wrong before one step.
TWO_LAYERS = r'''
import sys, torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 1))
opt = ot.OneBitAdam(model.parameters(), sys.argv[1])
while not opt.done:
    opt.zero_grad()
    loss = model(torch.randn(16, 8)).square().mean()
    loss.backward()
    if opt.rank == 1 and opt.next_step == {step}:
        {fault}
    opt.step(loss=loss)
'''
BROKEN = TWO_LAYERS.format(step=4, fault="model[0].weight.grad = None  # no gradient")
MOVED = TWO_LAYERS.format(step=3, fault="model[0].weight.data = model[0].weight.data.clone()")


DIVERGED = r'''
import sys
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
opt = ot.OneBitAdam(model.parameters(), config=sys.argv[1])
while not opt.done:
    opt.zero_grad()
    loss = model(torch.randn(16, 8)).square().mean()
    loss.backward()
    if opt.rank == 1 and opt.next_step == 3:
        loss = loss * float("nan")  # what a diverged training reports
    opt.step(loss=loss)
'''


LIKE_TORCH_OPTIM = r'''
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
model[0].requires_grad_(False)                     # a frozen layer
frozen = model[0].weight.detach().clone()
opt = ot.OneBitAdam(model.named_parameters(), lr=0.01, freeze_step=3, config={"steps": 8})
print("trainable", sum(p.numel() for p in model.parameters() if p.requires_grad))
x = torch.randn(32, 8)
def backward():
    opt.zero_grad()
    loss = (model(x) - 1).square().mean()
    loss.backward()
    return loss
opt.step(loss=backward())
for label, before in (("again", lambda: None), ("after zero_grad", opt.zero_grad),
                      ("after set_to_none", lambda: opt.zero_grad(set_to_none=True))):
    before()
    try:
        opt.step()
    except RuntimeError as e:
        print(f"refused {label}: {e}")
first = opt.next_step
while not opt.done:
    opt.step(loss=backward())
print("steps after the refusals:", first, "to the end")
assert torch.equal(model[0].weight, frozen), "the frozen layer moved"
print("frozen layer unchanged; last layer", model[2].weight.flatten().tolist())
'''


# A head that takes part in the loss every other step, zero_grad() in place: its .grad stays
# the zeroed view, which is no gradient.
UNUSED = r'''
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.ModuleDict({"body": torch.nn.Linear(8, 1), "head": torch.nn.Linear(8, 1)})
opt = ot.OneBitAdam(model.named_parameters(), lr=0.01, freeze_step=3, config={"steps": 8})
x = torch.randn(32, 8)
for t in range(1, 9):
    opt.zero_grad()
    loss = model["body"](x).square().mean()
    if t % 2 == 0:
        loss = loss + model["head"](x).square().mean()
    loss.backward()
    try:
        opt.step(loss=loss)
        print(f"step {t} ran")
    except ValueError as e:
        print(f"step {t} refused: {e}")
        break
'''


# torch 1.13's OneCycleLR keeps a bound method in its state_dict, so saving it pickles the
# scheduler and with it the optimizer (opt.state included).
ONECYCLE_SAVED = r'''
import io
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=2, config={"steps": 4})
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.02, total_steps=4)
x = torch.randn(8, 4)
while not opt.done:
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step(loss=loss)
    sched.step()
    if opt.next_step == 3:
        buffer = io.BytesIO()
        torch.save(sched.state_dict(), buffer)
        buffer.seek(0)
        saved = torch.load(buffer)
        # torch 1.13 pickles the optimizer with the scheduler (a bound anneal_func); torch
        # 2 keeps only the function's name there, and the state is the optimizer's own.
        holder = saved["anneal_func"].__self__.optimizer if "anneal_func" in saved else opt
        print("saved the scheduler; its optimizer's state holds",
              sorted(next(iter(holder.state.values()))))
opt.close()
try:
    opt.step()
except ot.OnebitError as e:
    print("after close:", e)
'''


LOSS_OR_NOT = r'''
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = ot.Adam(model.parameters(), lr=0.01, config={"steps": 4, "onebit": {"log_every": 2}})
x = torch.randn(8, 4)
while not opt.done:
    opt.zero_grad()
    loss = model(x).square().mean()
    loss.backward()
    opt.step(loss=loss) if opt.next_step > 2 else opt.step()  # steps 1-2 without a loss
'''


MASK_FILES = r'''
import os
import sys
import numpy as np
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)  # 10 parameters
mask = np.ones(10, dtype=bool)
mask[:2] = False
if sys.argv[1] == "differ" and ot.rank() == 1:
    mask[2] = False
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"mask-{ot.rank()}.npy")
np.save(path, mask)
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=2,
                    config={"steps": 4, "onebit": {"momentum_mask": {"npy": path}}})
x = torch.randn(8, 4)
while not opt.done:
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
print(f"rank {ot.rank()}: trained")
'''


STATE = r'''
import copy
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
twin = copy.deepcopy(model)
opt = ot.Adam(model.parameters(), lr=0.01, config={"steps": 4})
ref = torch.optim.Adam(twin.parameters(), lr=0.01)
print(f"before the first step: {len(opt.state)} entries, {opt.state[model.weight]}")
try:
    opt.state[torch.zeros(1)]
except KeyError:
    print("a foreign tensor: KeyError")
x = torch.randn(8, 4)
for step in range(3):
    for o, m in ((opt, model), (ref, twin)):
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()
state, want = opt.state[model.weight], ref.state[twin.weight]
same = [torch.allclose(state[k], want[k], rtol=1e-4, atol=0) for k in ("exp_avg", "exp_avg_sq")]
print(f"step 3: keys {' '.join(sorted(state))}, step {state['step'].item()}, "
      f"as torch.optim.Adam's: {same[0]} {same[1]}")
state["exp_avg"].zero_()
again = opt.state[model.weight]["exp_avg"]
flat = torch.cat([e["exp_avg"].reshape(-1) for e in opt.state_dict()["state"].values()])
print(f"a copy: {bool(again.abs().sum() > 0)}; as state_dict's: "
      f"{torch.equal(again.flatten(), flat[:8])}")
opt.zero_grad()
model(x).square().mean().backward()
opt.step()
assert opt.done
print(f"after the end: step {opt.state[model.bias]['step'].item()}, entries {len(opt.state)}")
'''


# The loop of the small regression scripts below: x to x.sum() through `model`.
TINY_LOOP = r'''
while not opt.done:
    opt.zero_grad()
    x = torch.randn(64, 8)
    loss = (model(x) - x.sum(1, keepdim=True)).square().mean()
    loss.backward()
    opt.step(loss=loss)
'''


AUTOMATIC_FREEZE = r'''
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = ot.OneBitAdam(model.parameters(), lr=0.01, config={"steps": 120, "onebit": {"log_every": 60}})
''' + TINY_LOOP


DEAD_UNITS = r'''
import json, os
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
with torch.no_grad():
    model[0].bias[:4] = -100.0  # dead units: no gradient in the warmup
opt = ot.OneBitAdam(model.parameters(), lr=0.01, freeze_step=10, config={"steps": 40},
                    **json.loads(os.environ.get("DEAD_UNITS_KWARGS", "{}")))
''' + TINY_LOOP


OPEN_ENDED = r'''
import os, torch
import onebit.torch as ot
model = torch.nn.Linear(8, 1)
opt = ot.OneBitAdam(model.parameters(), lr=1e-3, freeze_step=2)  # no steps: open-ended
for t in range(1000000):
    opt.zero_grad()
    model(torch.randn(8, 8)).square().mean().backward()
    opt.step()
    if t == 2:
        open(f"stepping-{ot.rank()}", "w").close()
'''


LAUNCHER = r'''
import os, subprocess, sys, time
script, port = sys.argv[1], sys.argv[2]
for r in (0, 1):
    env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
               LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    p = subprocess.Popen([sys.executable, script], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    print(p.pid, flush=True)
time.sleep(600)
'''


IMPORT_ONLY = r'''
import os, signal, sys, threading
names = ("excepthook", "SIGINT", "SIGTERM", "environ", "threads")
def now():
    return (sys.excepthook, signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM),
            dict(os.environ), threading.active_count())
before = now()
import onebit.torch
print("import changed:", [n for n, a, b in zip(names, before, now()) if a != b])
'''


MASKED = r'''
import sys
import torch
import onebit.torch as ot
torch.manual_seed(0)
positions = torch.nn.Embedding(16, 4)  # a model for 16 positions, trained on 8
head = torch.nn.Linear(4, 1)
rows = torch.zeros(16, 1)
rows[:8] = 1
masked = {"exp_avg_mask": rows} if sys.argv[1] == "masked" else {}
opt = ot.OneBitAdam([{"params": list(head.parameters())},
                     {"params": [positions.weight], **masked}],
                    lr=0.01, freeze_step=3, config={"steps": 12})
before = positions.weight.detach().clone()
x, y = torch.arange(8), torch.randn(8, 1)
while not opt.done:
    opt.zero_grad()
    loss = (head(positions(x)) - y).square().mean()
    loss.backward()
    opt.step(loss=loss)
m = torch.cat([e["exp_avg"].reshape(-1) for e in opt.state_dict()["state"].values()])
unused = m[5 + 8 * 4:]  # after the head's 5 parameters and the 8 rows trained on
after = positions.weight.detach()
print(f"unused rows: momentum {unused.abs().max().item()}, "
      f"moved {not torch.equal(after[8:], before[8:])}")
print(f"used rows: moved {not torch.equal(after[:8], before[:8])}")
'''


LOOP_LENGTH = r'''
import sys
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = ot.OneBitAdam(model.parameters(), lr=0.01, config={"steps": 4})
x = torch.randn(8, 4)
for i in range(int(sys.argv[1])):
    opt.zero_grad()
    model(x).square().mean().backward()
    try:
        opt.step()
    except ot.OnebitError as e:
        print(f"step {i + 1}: {e} (exit code {e.exit_code})", flush=True)
        break
'''

PROFILED = r'''
import torch
import onebit.torch as ot
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1))
opt = ot.OneBitAdam(model.parameters(), lr=0.01, config={"steps": 3})
x = torch.randn(8, 4)
for step in (1, 2, 3):
    opt.zero_grad(set_to_none=True)
    model(x).square().mean().backward()
    if step == 2:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            opt.step()
        for e in prof.key_averages():
            if e.key.startswith("onebit.step: "):
                print(f"range <{e.key}> x{e.count} {e.cpu_time_total:.0f} us", flush=True)
    else:
        opt.step()
'''


class OnebitRun(unittest.TestCase):
    """onebit-run (onebit/run.py), torchrun's contract on one machine: the variables each
    process gets, and the first failure ending the others with its exit code."""

    SCRIPT = """import json, os, signal, sys, time
keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
        "MASTER_PORT")
with open(os.path.join(sys.argv[1], "env-" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump({k: os.environ[k] for k in keys}, f)
with open(os.path.join(sys.argv[1], "restarts-" + os.environ["RANK"]), "a") as f:
    f.write(os.environ["TORCHELASTIC_RESTART_COUNT"] + "/" +
            os.environ["TORCHELASTIC_MAX_RESTARTS"] + " ")
ready = os.path.join(sys.argv[1], "ready-" + os.environ["TORCHELASTIC_RESTART_COUNT"])
if os.environ["LOCAL_RANK"] == "0":
    def stop(*_):
        print("rank 0 got SIGTERM", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    open(ready, "w").close()
else:  # rank 0 has started (and can hear SIGTERM) before rank 1 fails
    deadline = time.time() + 30
    while not os.path.exists(ready) and time.time() < deadline:
        time.sleep(0.01)
if sys.argv[2] == "fail" and os.environ["LOCAL_RANK"] == "1":
    sys.exit(3)
if sys.argv[2] == "job_failed" and os.environ["LOCAL_RANK"] == "1":
    sys.exit(78)
if sys.argv[2] == "fail_once" and os.environ["LOCAL_RANK"] == "1":
    sys.exit(3 if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" else 0)
if sys.argv[2] == "fail":
    time.sleep(60)
"""

    def run_it(self, tmp, *args, mode="ok"):
        script = os.path.join(tmp, "script.py")
        with open(script, "w") as f:
            f.write(self.SCRIPT)
        env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
        return subprocess.run([sys.executable, "-m", "onebit.run", *args, script, tmp, mode],
                              capture_output=True, text=True, timeout=60, env=env)

    def test_the_variables_torchrun_sets(self):
        tmp = tempfile.mkdtemp(prefix="onebit-run-")
        r = self.run_it(tmp, "--nproc_per_node=2", "--nnodes=3", "--node_rank=1",
                        "--master_addr=10.0.0.7", "--master_port=29123", "--log_dir=" + tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        for rank, local in ((2, 0), (3, 1)):
            with open(os.path.join(tmp, f"env-{rank}.json")) as f:
                self.assertEqual(json.load(f), {
                    "RANK": str(rank), "WORLD_SIZE": "6", "LOCAL_RANK": str(local),
                    "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1", "MASTER_ADDR": "10.0.0.7",
                    "MASTER_PORT": "29123"})
        self.assertTrue(os.path.exists(os.path.join(tmp, "rank-3.log")))
        # --master_port 0: a free port, the same for every rank.
        tmp = tempfile.mkdtemp(prefix="onebit-run-")
        self.assertEqual(self.run_it(tmp, "--nproc_per_node=2", "--master_port=0").returncode, 0)
        ports = set()
        for rank in (0, 1):
            with open(os.path.join(tmp, f"env-{rank}.json")) as f:
                ports.add(json.load(f)["MASTER_PORT"])
        self.assertEqual(len(ports), 1)
        self.assertNotEqual(ports, {"0"})

    def test_torchrun_command_lines(self):
        # What torchrun users type on one machine runs unchanged (before: "unrecognized
        # arguments"): --standalone, -m, --no_python, --rdzv_endpoint, --nnodes N:N.
        def env_of(tmp, rank):
            with open(os.path.join(tmp, f"env-{rank}.json")) as f:
                return json.load(f)

        tmp = tempfile.mkdtemp(prefix="onebit-run-")
        self.assertEqual(self.run_it(tmp, "--standalone", "--nproc-per-node=2").returncode, 0)
        ports = {env_of(tmp, r)["MASTER_PORT"] for r in (0, 1)}
        self.assertEqual(len(ports), 1)
        self.assertNotIn(ports.pop(), ("0", "29500"))  # a free one
        tmp = tempfile.mkdtemp(prefix="onebit-run-")
        r = self.run_it(tmp, "--nnodes=1:1", "--rdzv-backend=c10d", "--rdzv_id=job7",
                        "--rdzv-endpoint=localhost:29466", "--nproc_per_node=2")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual((env_of(tmp, 1)["MASTER_ADDR"], env_of(tmp, 1)["MASTER_PORT"]),
                         ("localhost", "29466"))
        # A module (python -m) and a program of its own (--no_python).
        tmp = tempfile.mkdtemp(prefix="onebit-run-")
        with open(os.path.join(tmp, "train_module.py"), "w") as f:
            f.write(self.SCRIPT)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), tmp]))
        r = subprocess.run([sys.executable, "-m", "onebit.run", "--nproc_per_node=2",
                            "--master_port=0", "-m", "train_module", tmp, "ok"],
                           capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(env_of(tmp, 1)["WORLD_SIZE"], "2")
        r = subprocess.run([sys.executable, "-m", "onebit.run", "--nproc_per_node=2",
                            "--master_port=0", "--no_python", "/bin/sh", "-c",
                            "echo rank $RANK of $WORLD_SIZE"],
                           capture_output=True, text=True, timeout=60, env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(sorted(r.stdout.split("\n")[:2]), ["rank 0 of 2", "rank 1 of 2"])
        # --nproc_per_node cpu: one process per core (gpu: per GPU, auto: either).
        tmp = tempfile.mkdtemp(prefix="onebit-run-")
        self.assertEqual(self.run_it(tmp, "--standalone", "--nproc_per_node=cpu").returncode, 0)
        self.assertEqual(env_of(tmp, 0)["WORLD_SIZE"], str(os.cpu_count()))
        # An elastic range is refused: the world size is fixed.
        r = self.run_it(tempfile.mkdtemp(prefix="onebit-run-"), "--nnodes=1:4")
        self.assertEqual(r.returncode, 2)
        self.assertIn("1:4 is an elastic range", r.stderr)

    def test_the_first_failure_ends_the_others_with_its_code(self):
        tmp = tempfile.mkdtemp(prefix="onebit-run-")
        r = self.run_it(tmp, "--nproc_per_node=2", "--master_port=0", "--grace_s=20", mode="fail")
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("onebit-run: rank 1 exited with code 3; stopping the others", r.stderr)
        self.assertIn("rank 0 got SIGTERM", r.stdout)

    def restarted(self, mode, max_restarts):
        """onebit-run --max_restarts over 2 processes of SCRIPT in `mode`: the run, and what
        each rank's starts saw (TORCHELASTIC_RESTART_COUNT/TORCHELASTIC_MAX_RESTARTS)."""
        tmp = tempfile.mkdtemp(prefix="onebit-run-")
        r = self.run_it(tmp, "--nproc_per_node=2", "--master_port=0",
                        f"--max_restarts={max_restarts}", "--grace_s=20", mode=mode)
        starts = []
        for rank in (0, 1):
            with open(os.path.join(tmp, f"restarts-{rank}")) as f:
                starts.append(f.read())
        return r, starts

    def test_max_restarts_starts_the_whole_group_again(self):
        r, starts = self.restarted("fail_once", 2)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("onebit-run: rank 1 exited with code 3; restarting the group", r.stderr)
        self.assertIn("onebit-run: restart 1 of at most 2", r.stderr)
        self.assertEqual(starts, ["0/2 1/2 "] * 2)  # both ran twice, as under torchrun
        # Restarts used up: the failure's code, after the last one.
        r, starts = self.restarted("fail", 1)
        self.assertEqual(r.returncode, 3, r.stderr)
        self.assertIn("onebit-run: restart 1 of at most 1", r.stderr)
        self.assertIn("onebit-run: rank 1 exited with code 3; stopping the others", r.stderr)
        self.assertEqual(starts, ["0/1 1/1 "] * 2)
        # 78, onebit's "the job failed: do not restart", is not restarted.
        r, starts = self.restarted("job_failed", 3)
        self.assertEqual(r.returncode, 78, r.stderr)
        self.assertIn("onebit-run: rank 1 exited with code 78; stopping the others; exit "
                      "code 78 says the job failed and no restart fixes it, so the group is "
                      "not restarted", r.stderr)
        self.assertEqual(starts, ["0/3 "] * 2)

    def test_bad_arguments(self):
        tmp = tempfile.mkdtemp(prefix="onebit-run-")
        r = self.run_it(tmp, "--nproc_per_node=2", "--nnodes=2", "--node_rank=2")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--node_rank must be in [0, 2)", r.stderr)
        r = self.run_it(tmp, "--max_restarts=-1")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--max_restarts must be >= 0", r.stderr)


class Overlap(unittest.TestCase):
    """The warmup exchange during backward() (overlap, on by default for CPU tensors), as
    torch users write the loop: no_sync micro-batches, set_to_none, named parameters. With
    two workers every sum order gives the same bits, so overlap on and off must agree bit
    for bit; a gradient sent and then changed is an error naming the parameter."""

    def run_mode(self, tmp, mode, *more):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(HERE), os.path.join(BIN, "python")]), OMP_NUM_THREADS="1")
        for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(k, None)
        logs = os.path.join(tmp, mode + "".join(more))
        r = subprocess.run([sys.executable, "-m", "onebit.run", "--nproc_per_node=2",
                            "--master_port=0", "--log_dir=" + logs,
                            os.path.join(HERE, "overlap_train.py"),
                            os.path.join(tmp, mode + "".join(more) + ".npy"), mode, *more],
                           capture_output=True, text=True, timeout=180, env=env)
        text = ""
        for rank in (0, 1):
            with open(os.path.join(logs, f"rank-{rank}.log")) as f:
                text += f.read()
        return r, text

    def test_same_bits_on_and_off_and_changed_gradients_refused(self):
        tmp = tempfile.mkdtemp(prefix="onebit-overlap-")
        r, on_log = self.run_mode(tmp, "on")
        self.assertEqual(r.returncode, 0, on_log[-3000:])
        self.assertIn("exchange overlap: on, 2 buckets from the workload's 2 gradient ranges",
                      on_log)
        r, off_log = self.run_mode(tmp, "off")
        self.assertEqual(r.returncode, 0, off_log[-3000:])
        self.assertNotIn("exchange overlap: on", off_log)
        self.assertSameBits = StreamCase.assertSameBits.__get__(self)
        self.assertSameBits(np.load(os.path.join(tmp, "on.npy")),
                            np.load(os.path.join(tmp, "off.npy")))
        r, log = self.run_mode(tmp, "twice")
        self.assertNotEqual(r.returncode, 0)
        self.assertRegex(log, r"parameter '\d\.(weight|bias)' \(.*\) got a second gradient "
                         r"before step\(\), after the first went to the exchange")
        r, log = self.run_mode(tmp, "modified")
        self.assertNotEqual(r.returncode, 0)
        self.assertRegex(log, r"the gradient of parameter '4\.bias' \(.*\) changed "
                         r"after backward\(\) handed it to the exchange")
        # torch's clip_grad_norm_ is refused at its first call, with the fix, whether it
        # clips (a norm of 1e-3) or not (1e9: it still scales in place, by 1); before, the
        # job died at the first step whose norm it clipped.
        for max_norm in ("1e-3", "1e9"):
            r, log = self.run_mode(tmp, "clipped", max_norm)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("the gradients were changed in place after backward() handed them to "
                          "the exchange (overlap on), as torch.nn.utils.clip_grad_norm_ does: "
                          "clip with opt.clip_grad_norm_(max_norm)", log)


    def test_same_bits_on_and_off_with_a_shard_on_the_node(self):
        # ps with servers "per_node": the warmup goes between the workers, so it overlaps
        # backward() by default, as in peer mode (before: a ValueError asking for
        # overlap=False), and the compression stage goes through the node's shard.
        tmp = tempfile.mkdtemp(prefix="onebit-overlap-ps-")
        r, on_log = self.run_mode(tmp, "on", "ps")
        self.assertEqual(r.returncode, 0, on_log[-3000:])
        self.assertIn("exchange overlap: on, 2 buckets from the workload's 2 gradient ranges",
                      on_log)
        self.assertIn("1 servers (the warmup between the workers)", on_log)
        r, off_log = self.run_mode(tmp, "off", "ps")
        self.assertEqual(r.returncode, 0, off_log[-3000:])
        self.assertNotIn("exchange overlap: on", off_log)
        StreamCase.assertSameBits.__get__(self)(np.load(os.path.join(tmp, "onps.npy")),
                                                np.load(os.path.join(tmp, "offps.npy")))


def on_two_ranks(name, script, *args):
    """Runs `script` (with `args`) on two ranks under onebit-run: (its result, the ranks'
    logs)."""
    tmp = tempfile.mkdtemp(prefix=f"onebit-{name}-")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(HERE), os.path.join(BIN, "python")]), OMP_NUM_THREADS="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    r = subprocess.run([sys.executable, "-m", "onebit.run", "--nproc_per_node=2",
                        "--master_port=0", "--log_dir=" + tmp, script, *args],
                       capture_output=True, text=True, timeout=180, env=env)
    logs = []
    for rank in (0, 1):
        with open(os.path.join(tmp, f"rank-{rank}.log")) as f:
            logs.append(f.read())
    return r, logs


class TorchDistributedCheckpoint(unittest.TestCase):
    def test_get_set_optimizer_state_dict_and_dcp_round_trip(self):
        import importlib  # noqa: PLC0415
        try:
            importlib.import_module("torch.distributed.checkpoint.state_dict")  # torch >= 2.2
        except ImportError:
            self.skipTest(f"torch {torch.__version__} has no torch.distributed.checkpoint."
                          "state_dict (torch >= 2.2): the torch-latest stack runs this")
        ckpt = os.path.join(tempfile.mkdtemp(prefix="onebit-dcp-"), "ckpt")
        script = os.path.join(HERE, "dcp_train.py")
        r, logs = on_two_ranks("dcp-first", script, "first", ckpt, "10")
        self.assertEqual(r.returncode, 0, r.stderr + "".join(logs)[-3000:])
        for rank, log in enumerate(logs):
            self.assertIn(f"rank {rank}: saved step 10, state of 0.bias, 0.weight, 2.bias, "
                          "2.weight", log)
        r, logs = on_two_ranks("dcp-resume", script, "resume", ckpt, "20")
        self.assertEqual(r.returncode, 0, r.stderr + "".join(logs)[-3000:])
        digests = set()
        for rank, log in enumerate(logs):
            # Without the state hook: DCP would take a step of its own to make a state.
            self.assertIn(f"rank {rank}: loaded step 10, moments as saved: True", log)
            self.assertIn(f"worker rank {rank}: starts after step 10 from its loaded state", log)
            m = re.search(rf"rank {rank}: 10 steps, loss [0-9.]+ -> [0-9.]+, digest (\S+)", log)
            self.assertIsNotNone(m, log[-3000:])
            digests.add(m.group(1))
        self.assertEqual(len(digests), 1, digests)  # the replicas agree


class TwoOptimizers(unittest.TestCase):
    def test_a_second_optimizer_is_refused_while_the_first_is_in_its_job(self):
        # Before: rank 0's second optimizer failed to bind MASTER_PORT + 1 ("choose another
        # MASTER_PORT"), and elsewhere a second member of the same rank would have joined.
        r, logs = on_two_ranks("two", os.path.join(HERE, "two_optimizers.py"))
        self.assertEqual(r.returncode, 0, r.stderr + "".join(logs)[-3000:])
        for rank, log in enumerate(logs):
            self.assertIn(f"rank {rank}: refused: another onebit optimizer of this process is "
                          "still in its job", log)
            self.assertIn(f"rank {rank}: the first job ended", log)


class MomentumMask(unittest.TestCase):
    def test_a_param_groups_exp_avg_mask_keeps_unused_rows_still(self):
        """DeepSpeed's exp_avg_mask (BERT's position embeddings past the sequence length):
        rows whose gradient is always zero keep a zero momentum through the compressed
        exchange, which cannot send an exact zero, and so do not move; without the mask
        they do. (Two ranks: one worker alone has nothing to exchange.)"""
        script = os.path.join(tempfile.mkdtemp(prefix="onebit-mask-"), "masked.py")
        with open(script, "w") as f:
            f.write(MASKED)
        r, logs = on_two_ranks("masked", script, "masked")
        self.assertEqual(r.returncode, 0, r.stderr + "".join(logs)[-3000:])
        for log in logs:
            self.assertIn("unused rows: momentum 0.0, moved False", log)
            self.assertIn("used rows: moved True", log)
        r, logs = on_two_ranks("unmasked", script, "unmasked")
        self.assertEqual(r.returncode, 0, r.stderr + "".join(logs)[-3000:])
        for log in logs:
            self.assertRegex(log, r"unused rows: momentum [0-9.e-]+, moved True")
            self.assertNotIn("unused rows: momentum 0.0,", log)


class JobIdentity(unittest.TestCase):
    """Every rank joins the job its script means: with the job's config, and the script's
    n-th optimizer with the n-th job."""

    def test_jobs_one_after_another_in_one_script(self):
        # Before: rank 1's second optimizer reached the first job's coordinator, still up
        # on rank 0, and failed ("the job is over"), or, while that job still ran, failed
        # it with the second model's size.
        r, logs = on_two_ranks("two-jobs", os.path.join(HERE, "two_jobs.py"))
        self.assertEqual(r.returncode, 0, r.stderr + "".join(logs)[-3000:])
        heads = []
        for rank, log in enumerate(logs):
            self.assertIn(f"rank {rank}: the first job ended", log)
            self.assertIn(f"rank {rank}: the second job ended", log)
            heads.append(re.search(rf"rank {rank}: head (.*)", log).group(1))
        self.assertEqual(heads[0], heads[1])  # one job: the ranks' parameters agree

    def test_a_rank_with_another_config_fails_the_job_naming_the_key(self):
        # Rank 1 computes its lr another way: before, each rank trained with its own lr,
        # and the ranks' parameters drifted apart without a word.
        tmp = tempfile.mkdtemp(prefix="onebit-lr-")
        path = os.path.join(tmp, "train.py")
        with open(path, "w") as f:
            f.write("import torch\n"
                    "import onebit.torch as ot\n"
                    "model = torch.nn.Linear(8, 1)\n"
                    "lr = 1e-3 * (1 + ot.rank())\n"
                    "opt = ot.OneBitAdam(model.parameters(), lr=lr, config={'steps': 4})\n"
                    "while not opt.done:\n"
                    "    opt.zero_grad()\n"
                    "    model(torch.randn(4, 8)).square().mean().backward()\n"
                    "    opt.step()\n")
        r, logs = on_two_ranks("lr", path)
        self.assertEqual(r.returncode, 78, r.stderr + "".join(logs)[-3000:])
        # In rank 0's log (the coordinator's, and its worker's verdict); the launcher may
        # stop rank 1 before it says it.
        # Whichever registered first is the one the other is held to.
        self.assertRegex(logs[0], r"worker (1 \(.*\) has another config than worker 0 \(.*\): "
                                  r"optimizer\.params\.lr 0\.002 \(worker 0's: 0\.001\)|"
                                  r"0 \(.*\) has another config than worker 1 \(.*\): "
                                  r"optimizer\.params\.lr 0\.001 \(worker 1's: 0\.002\))")


    def test_ranks_with_other_mask_files_are_held_to_what_the_files_mask(self):
        # Each rank reads its own .npy (the path may differ per process): the same zeros in
        # both train; another zero in rank 1's fails the job naming the key. Before, the
        # contents were not compared and the ranks' momenta drifted apart.
        tmp = tempfile.mkdtemp(prefix="onebit-mask-files-")
        path = os.path.join(tmp, "train.py")
        with open(path, "w") as f:
            f.write(MASK_FILES)
        r, logs = on_two_ranks("same-mask", path, "same")
        self.assertEqual(r.returncode, 0, r.stderr + "".join(logs)[-3000:])
        for rank, log in enumerate(logs):
            self.assertIn(f"rank {rank}: trained", log)
        r, logs = on_two_ranks("other-mask", path, "differ")
        self.assertEqual(r.returncode, 78, r.stderr + "".join(logs)[-3000:])
        self.assertRegex(logs[0], r"has another config than worker [01] \(.*\): "
                                  r"onebit\.momentum_mask\.npy \"[23] of 10 masked, digest "
                                  r"[0-9a-f]{16}\" \(worker [01]'s: \"[23] of 10 masked")


class ScriptErrors(unittest.TestCase):
    """onebit's own checks of a script fail the job on every rank with 78, at once."""

    def test_a_gans_second_optimizer_fails_every_rank_at_once(self):
        start = time.monotonic()
        r, logs = on_two_ranks("gan", os.path.join(HERE, "gan_optimizers.py"))
        self.assertEqual(r.returncode, 78, r.stderr + "".join(logs)[-3000:])
        self.assertLess(time.monotonic() - start, 60)
        # (onebit-run ends the other rank once the first exits: its log may be cut short.)
        self.assertIn("ScriptValueError: another onebit optimizer of this process is still "
                      "in its job", "".join(logs))


    def test_ctrl_c_is_an_interrupt_not_a_failure_to_restart(self):
        r, logs = on_two_ranks("interrupted", os.path.join(HERE, "interrupted.py"))
        out = r.stdout + r.stderr + "".join(logs)
        self.assertNotIn(r.returncode, (0, 75), out[-3000:])
        self.assertIn("KeyboardInterrupt", out)
        self.assertIn("job FAILED", out)
        self.assertNotIn("recovery 1", out)


def process_state(pid):
    """A process's state letter from /proc (Z: a zombie), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


class DiesWithItsLauncher(unittest.TestCase):
    def test_ranks_end_when_their_launcher_is_killed(self):
        # A launcher of its own (as torchrun starts ranks: plain children with RANK set),
        # SIGKILLed while its two ranks train an open-ended job. Before: they trained on.
        tmp = tempfile.mkdtemp(prefix="onebit-orphans-")
        script = os.path.join(tmp, "train.py")
        with open(script, "w") as f:
            f.write(OPEN_ENDED)
        launcher = os.path.join(tmp, "launcher.py")
        with open(launcher, "w") as f:
            f.write(LAUNCHER)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [os.path.dirname(HERE), os.path.join(BIN, "python")]), OMP_NUM_THREADS="1")
        parent = subprocess.Popen([sys.executable, launcher, script, str(free_port_run(3))],
                                  env=env, cwd=tmp, stdout=subprocess.PIPE, text=True)
        pids = [int(parent.stdout.readline()) for _ in range(2)]
        deadline = time.monotonic() + 60
        while not all(os.path.exists(os.path.join(tmp, f"stepping-{r}")) for r in (0, 1)):
            self.assertLess(time.monotonic(), deadline, "the ranks did not start")
            time.sleep(0.2)
        parent.kill()
        parent.wait()
        parent.stdout.close()
        deadline = time.monotonic() + 30
        alive = pids
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = [p for p in pids if process_state(p) not in (None, "Z")]
        for p in alive:
            os.kill(p, 9)
        self.assertEqual(alive, [], "ranks outlived their launcher")


class GradScalerLikeTorch(unittest.TestCase):
    def test_an_overflow_on_one_rank_is_skipped_and_seen_by_every_scaler(self):
        if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
            self.skipTest(f"torch {torch.__version__} has no torch.amp.GradScaler (torch >= "
                          "2.3): the torch-latest stack runs this")
        r, logs = on_two_ranks("scaler", os.path.join(HERE, "grad_scaler.py"), "7")
        self.assertEqual(r.returncode, 0, r.stderr + "".join(logs)[-3000:])
        digests = set()
        for rank, log in enumerate(logs):
            m = re.search(rf"rank {rank}: halved \[7\], unchanged \[7\], loss ([0-9.]+) -> "
                          rf"([0-9.]+), digest (\S+)", log)
            self.assertIsNotNone(m, log[-3000:])
            self.assertLess(float(m.group(2)), float(m.group(1)))
            digests.add(m.group(3))
        self.assertEqual(len(digests), 1, digests)  # the replicas agree

    def test_the_fp16_block_and_a_grad_scaler_together_are_refused(self):
        if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
            self.skipTest(f"torch {torch.__version__} has no torch.amp.GradScaler")
        import onebit.torch as ot
        p = torch.nn.Parameter(torch.ones(4))
        opt = ot.OneBitAdam([p], lr=0.1, freeze_step=2, overlap=False,
                            config={"steps": 2, "fp16": {"enabled": True}},
                            coordinator="127.0.0.1:1")
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(p.sum()).backward()
        with self.assertRaises(ot.ScriptValueError) as e:  # before joining any job
            scaler.step(opt)
        self.assertIn("GradScaler and the job config's fp16 block both scale", str(e.exception))
        opt.close()


def skip_without_cpu_float16(test):
    """Skips `test` where this torch has no float16 matrix product on the CPU (torch 1.13)."""
    try:
        torch.nn.functional.linear(torch.ones(2, 2, dtype=torch.float16),
                                   torch.ones(2, 2, dtype=torch.float16))
    except RuntimeError as e:
        test.skipTest(f"torch {torch.__version__} has no float16 matrix product on the CPU "
                      f"({e}): the torch-latest stack runs this")


def train_low_precision(test, dtype, *exchange):
    """python/tests/low_precision.py on two ranks: each must train (its loss falls to under a
    quarter) with its parameters in `dtype`, its state float32 and its buffers as expected
    (synced). The ranks' digests of the parameters after every step."""
    name = "-".join(("low", dtype) + exchange)
    r, logs = on_two_ranks(name, os.path.join(HERE, "low_precision.py"), dtype, *exchange)
    test.assertEqual(r.returncode, 0, r.stderr + "".join(logs)[-3000:])
    digests = []
    for rank, log in enumerate(logs):
        m = re.search(rf"rank {rank}: parameters \['torch.{dtype}'\], state torch.float32, "
                      rf"synced True, loss ([0-9.]+) -> ([0-9.]+), digest (\w+)", log)
        test.assertIsNotNone(m, log[-3000:])
        test.assertLess(float(m.group(2)), float(m.group(1)) / 4)  # it trains
        digests.append(m.group(3))
    return digests


class LowPrecisionParameters(unittest.TestCase):
    """bfloat16 and float16 models without autocast (before: a ValueError, float32 only)."""

    def test_bfloat16(self):
        train_low_precision(self, "bfloat16")

    def test_float16(self):
        skip_without_cpu_float16(self)
        train_low_precision(self, "float16")


class ShardedLowPrecisionParameters(unittest.TestCase):
    """With shard_state, a bfloat16 or float16 model's parameters view the worker's own
    low-precision buffer (its float32 masters sharded; a bfloat16 model's gradients its
    bfloat16 gradient buffer): the parameters after every step are those of the same job
    unsharded, which copies each master back, bit for bit."""

    def same_bits(self, dtype):
        sharded = train_low_precision(self, dtype, "sharded")
        self.assertEqual(sharded[0], sharded[1])  # both ranks alike
        self.assertEqual(sharded, train_low_precision(self, dtype, "hier"))

    def test_bfloat16(self):
        self.same_bits("bfloat16")

    def test_float16(self):
        skip_without_cpu_float16(self)
        self.same_bits("float16")


class ShardedState(unittest.TestCase):
    """onebit.exchange.shard_state through the package (python/tests/sharded_state.py): the
    shard_state keyword, the same bits as the unsharded job, state_dict()'s own range and
    state_dict(full=True)'s gathered whole state, each loaded back."""

    def test_keyword_and_config_agree_and_misuse_is_refused_at_construction(self):
        import onebit.torch as ot
        p = [torch.nn.Parameter(torch.zeros(N))]

        def refused(exchange, text, optimizer="OneBitAdam", **kw):
            cfg = job_config(optimizer, {"lr": 0.001})
            cfg["onebit"]["exchange"] = exchange
            with self.assertRaises(ValueError) as e:
                getattr(ot, optimizer)(p, cfg, coordinator="127.0.0.1:1", **kw)
            self.assertIn(text, str(e.exception))

        hier = {"mode": "hierarchical", "local_size": 2}
        refused(dict(hier, shard_state=False), "shard_state=True while the job config's "
                "onebit.exchange.shard_state is False: give one of the two", shard_state=True)
        refused(dict(hier, shard_state=True), "shard_state=False while the job config's "
                "onebit.exchange.shard_state is True", shard_state=False)
        # The C++ config's checks, naming the key.
        refused({"mode": "peer"}, "OneBitAdam: onebit.exchange.shard_state: only applies to "
                "mode hierarchical, not peer", shard_state=True)
        refused({"mode": "hierarchical", "local_size": 1},
                "onebit.exchange.shard_state: needs local_size >= 2", shard_state=True)
        refused(hier, "onebit.exchange.shard_state: not with ZeroOneAdam", "ZeroOneAdam",
                shard_state=True)

    def test_same_bits_as_unsharded_and_state_dicts_round_trip(self):
        out = tempfile.mkdtemp(prefix="onebit-sharded-")
        script = os.path.join(HERE, "sharded_state.py")
        logs = {}
        for mode in ("sharded", "whole", "resume"):
            r, logs[mode] = on_two_ranks(f"shard-{mode}", script, mode, out)
            self.assertEqual(r.returncode, 0, r.stderr + "".join(logs[mode])[-3000:])
        final = {m: np.load(os.path.join(out, m + ".npy")) for m in ("sharded", "whole",
                                                                      "resume")}
        # Sharded, each rank's own range and the gathered whole state loaded back after
        # step 8, and a fresh sharded job from the own ranges: the unsharded job's bits
        # (which loaded the sharded job's gathered state too).
        StreamCase.assertSameBits(self, final["sharded"], final["whole"])
        StreamCase.assertSameBits(self, final["resume"], final["whole"])
        for rank in (0, 1):
            self.assertIn(f"worker rank {rank}: starts after step 8 from its loaded state",
                          logs["resume"][rank])
            self.assertIn(f"rank {rank}: loaded the sharded job's gathered state",
                          logs["whole"][rank])
            self.assertNotIn("refused", logs["whole"][rank])

        def load(mode, rank, kind):
            return torch.load(os.path.join(out, f"{mode}-rank{rank}-{kind}.pt"),
                              weights_only=not torch.__version__.startswith("1."))

        sizes = [48, 16, 256, 16, 64, 4]  # 3-16-16-4
        offsets = np.cumsum([0] + sizes)
        covered = {}
        for rank in (0, 1):
            whole = load("whole", rank, "own")
            self.assertEqual(load("whole", rank, "full")["state"].keys(), whole["state"].keys())
            full = load("sharded", rank, "full")
            own = load("sharded", rank, "own")
            self.assertNotIn("shard", full["param_groups"][0]["onebit"])
            self.assertEqual(sorted(full["state"]), list(range(6)))
            for i, entry in whole["state"].items():
                for name, t in entry.items():
                    self.assertTrue(torch.equal(full["state"][i][name], t), (rank, i, name))
            for key in ("step", "freeze_step", "scalars"):
                self.assertEqual(full["param_groups"][0]["onebit"][key],
                                 whole["param_groups"][0]["onebit"][key], key)
            errors = full["param_groups"][0]["onebit"]["errors"]
            for name, t in whole["param_groups"][0]["onebit"]["errors"].items():
                self.assertTrue(torch.equal(errors[name], t), name)
            # The own range: whole parameters in "state", the straddling parts in "shard".
            shard = own["param_groups"][0]["onebit"]["shard"]
            lo, hi = shard["begin"], shard["end"]
            self.assertEqual(shard["names"], ["exp_avg", "exp_avg_sq"])
            self.assertNotIn("state_begin", own["param_groups"][0]["onebit"]["scalars"])
            inside = [i for i in range(6) if lo <= offsets[i] and offsets[i + 1] <= hi]
            self.assertEqual(sorted(own["state"]), inside)
            for i, part in shard["partial"].items():
                self.assertNotIn(i, inside)
                for name, t in part["state"].items():
                    self.assertTrue(torch.equal(
                        t, whole["state"][i][name].reshape(-1)[part["begin"]:part["end"]]))
                covered.setdefault(i, []).append((part["begin"], part["end"]))
            for i in inside:
                for name, t in own["state"][i].items():
                    self.assertTrue(torch.equal(t, whole["state"][i][name]), (i, name))
            self.assertIn(f"rank {rank}: own [{lo}, {hi})", logs["sharded"][rank])
            self.assertIn(f"rank {rank}: after the end: state_dict(full=True): the job is over: "
                          "a sharded worker's node has left", logs["sharded"][rank])
            for i, name in enumerate(["0.weight", "0.bias", "2.weight", "2.bias", "4.weight",
                                      "4.bias"]):
                held = "served" if i in inside else "refused"
                self.assertIn(f"rank {rank}: opt.state[{name}] {held}", logs["sharded"][rank])
            self.assertRegex(logs["sharded"][rank], r"refused: .*this worker holds \[\d+, "
                             r"\d+\) \(sharded state\); opt.state_dict\(full=True\) gathers")
        # 2.weight straddles the two ranges; together they cover it.
        self.assertEqual(sorted(covered), [2])
        parts = sorted(covered[2])
        self.assertEqual((parts[0][0], parts[0][1], parts[1][1]), (0, parts[1][0], 256))

    def test_bfloat16_model_same_bits_as_unsharded(self):
        # The float32 master copy is whole on every worker (the node's all-gather), and the
        # bfloat16 parameters take its value after each step, sharded or not.
        out = tempfile.mkdtemp(prefix="onebit-sharded-bf16-")
        script = os.path.join(HERE, "sharded_state.py")
        for mode in ("sharded", "whole"):
            r, logs = on_two_ranks(f"shard-bf16-{mode}", script, mode, out, "bfloat16")
            self.assertEqual(r.returncode, 0, r.stderr + "".join(logs)[-3000:])
        StreamCase.assertSameBits(self, np.load(os.path.join(out, "sharded.npy")),
                                  np.load(os.path.join(out, "whole.npy")))


class TrainedLikeTorchOptim(unittest.TestCase):
    """One process alone (it runs its own coordinator): named parameters, a frozen layer
    left out of the job, and a step() without a new gradient refused without harm."""

    def run_alone(self, script, *args):
        """Runs `script` as one process with no launcher variables: (result, its output)."""
        tmp = tempfile.mkdtemp(prefix="onebit-alone-")
        path = os.path.join(tmp, "train.py")
        with open(path, "w") as f:
            f.write(script)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("ONEBIT_", "SLURM_", "MASTER_")) and
               k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(HERE), os.path.join(BIN, "python")])
        r = subprocess.run([sys.executable, path, *args], capture_output=True, text=True,
                           timeout=120, env=env, cwd=tmp)
        return r, r.stdout + r.stderr

    def test_frozen_layers_names_and_steps_without_a_gradient(self):
        r, out = self.run_alone(LIKE_TORCH_OPTIM)
        self.assertEqual(r.returncode, 0, out[-3000:])
        self.assertIn("trainable 5", out)  # 4 weights + 1 bias: the frozen 36 left out
        self.assertIn("refused again: step() without a new gradient", out)
        self.assertIn("refused after zero_grad: step() without a new gradient", out)
        # Before: a ValueError that parameter 0 took no part in the loss.
        self.assertIn("refused after set_to_none: step() without a new gradient", out)
        self.assertIn("steps after the refusals: 2 to the end", out)
        self.assertIn("frozen layer unchanged", out)

    def test_a_parameter_outside_the_loss_is_refused_after_an_in_place_zero_grad(self):
        # Before, the head's zeroed .grad passed as a gradient: in the compression stage
        # its momentum's sign bits moved it by ~1e5 (a probe's unused layer: 4.6e5).
        r, out = self.run_alone(UNUSED)
        self.assertIn("step 1 refused: parameter 'head.weight' ((1, 8)) has no gradient on "
                      "this step", out)
        self.assertNotIn("step 1 ran", out)

    def test_a_onecycle_schedulers_state_saves(self):
        # Before: TypeError: cannot pickle 'weakref.ReferenceType' object (opt.state).
        r, out = self.run_alone(ONECYCLE_SAVED)
        self.assertEqual(r.returncode, 0, out[-3000:])
        self.assertIn("saved the scheduler; its optimizer's state holds ['exp_avg', "
                      "'exp_avg_sq', 'step']", out)
        # Not "after the job's last step" (of a job without steps, 2^40 before).
        self.assertIn("after close: step() after the optimizer was closed", out)

    def test_a_step_without_a_loss_prints_no_loss(self):
        # Before, "loss 0.0000" stood in the progress line of a script that hands the
        # optimizer no loss (and 0 in onebit_worker_loss and the job's last_loss).
        r, out = self.run_alone(LOSS_OR_NOT)
        self.assertEqual(r.returncode, 0, out[-3000:])
        lines = re.findall(r"^.*step [24]/4 .*$", out, re.M)
        self.assertEqual(len(lines), 2, out[-3000:])
        self.assertNotIn("loss", lines[0])
        self.assertRegex(lines[1], r"step 4/4  loss [0-9.]+  stage ")

    def test_a_loop_longer_or_shorter_than_the_job_is_told_so(self):
        r, out = self.run_alone(LOOP_LENGTH, "6")  # the job has 4 steps
        self.assertEqual(r.returncode, 0, out[-3000:])
        self.assertIn("step 5: step() after the job's last step (4, onebit.steps): the training "
                      "loop is longer than the job", out)
        self.assertIn("(exit code 1)", out)
        r, out = self.run_alone(LOOP_LENGTH, "2")
        self.assertIn("the script exited after step 2 of the job's 4 (onebit.steps): the "
                      "training loop is shorter than the job", out)
        # The job failed for good: the process tells its launcher (before: exit 0).
        self.assertEqual(r.returncode, 78, out[-3000:])
        self.assertIn("exiting with 78 (do not restart)", out)

    def test_without_a_freeze_step_the_freeze_is_automatic(self):
        # Before: freeze_step's default, 100000, and a job that never compressed, silently.
        r, out = self.run_alone(AUTOMATIC_FREEZE)
        self.assertEqual(r.returncode, 0, out[-3000:])
        self.assertIn("onebit: no freeze_step given: the freeze is automatic", out)
        self.assertRegex(out, r"switch to compression scheduled after step \d+ \(automatic: ")
        self.assertIn("step 120/120", out)
        self.assertRegex(out, r"step 120/120 .*stage compression")
        # The package's own bias_correction default is no notice of the user's.
        self.assertNotIn("bias_correction", out)

    def test_a_loss_that_jumps_after_the_freeze_is_reported_with_its_cause(self):
        # Four dead ReLU units: their weights' variance freezes at 0, and the compressed
        # momentum moves them by scale/eps. Before: nothing was said until the loss was inf
        # (here the step after; a slower blow-up never got there).
        # update_clip=0 is DeepSpeed's update, which diverges here; the default clip (2)
        # bounds those weights' steps, and the same job trains without a warning.
        path = os.path.join(tempfile.mkdtemp(prefix="onebit-dead-"), "train.py")
        with open(path, "w") as f:
            f.write(DEAD_UNITS)
        os.environ["DEAD_UNITS_KWARGS"] = json.dumps({"update_clip": 0})
        try:
            r, logs = on_two_ranks("dead", path)  # one worker alone sends nothing compressed
        finally:
            del os.environ["DEAD_UNITS_KWARGS"]
        out = "".join(logs)
        self.assertRegex(out, r"warning: the loss is \S+ at step 1[1-9], \S+x the warmup's "
                              r"last losses \(\S+\): the compression stage is diverging\. "
                              r"Likely cause: elements whose variance froze at ~0")
        self.assertIn("scale/eps = scale/1e-08 (update_clip 0: none)", out)
        r, logs = on_two_ranks("dead-clipped", path)
        out = "".join(logs)
        self.assertEqual(r.returncode, 0, out[-3000:])
        self.assertNotIn("diverging", out)

    def test_importing_changes_nothing_global(self):
        r, out = self.run_alone(IMPORT_ONLY)
        self.assertEqual(r.returncode, 0, out[-3000:])
        self.assertIn("import changed: []", out)

    def test_state_reads_like_torch_adams(self):
        r, out = self.run_alone(STATE)
        self.assertEqual(r.returncode, 0, out[-3000:])
        self.assertIn("before the first step: 0 entries, {}", out)
        self.assertIn("a foreign tensor: KeyError", out)
        self.assertIn("step 3: keys exp_avg exp_avg_sq step, step 3.0, as torch.optim.Adam's: "
                      "True True", out)
        self.assertIn("a copy: True; as state_dict's: True", out)
        self.assertIn("after the end: step 4.0, entries 2", out)

    def test_step_names_its_phases_for_torch_profiler(self):
        """tools/gpu/step_bench.py splits the host's part of a step by these ranges."""
        r, out = self.run_alone(PROFILED)
        self.assertEqual(r.returncode, 0, out[-3000:])
        ranges = re.findall(r"range <(onebit\.step: [^>]+)> x(\d+)", out)
        self.assertEqual(sorted(ranges), [("onebit.step: gradients into the buffer", "1"),
                                          ("onebit.step: hand-over to the worker", "1"),
                                          ("onebit.step: the worker's step", "1")], out[-3000:])


class JobErrors(unittest.TestCase):
    """Errors that need the job: they end it, and every process hears of it."""

    def script(self, tmp, text):
        path = os.path.join(tmp, "train.py")
        with open(path, "w") as f:
            f.write(text)
        return path

    def failed_run(self, name, text):
        """A 50-step job of the two-layer model (41 parameters) running script `text`,
        which must fail: the launcher's result and worker 1's log."""
        tmp = tempfile.mkdtemp(prefix=f"onebit-{name}-")
        r = launch(tmp, job_config("OneBitAdam", {"lr": 0.001, "freeze_step": 5},
                                   parameters=8 * 4 + 4 + 4 + 1, steps=50),
                   [self.script(tmp, text), "{config}"], timeout=120)
        self.assertNotEqual(r.returncode, 0)
        with open(os.path.join(tmp, "out", "onebit_adam", "worker-1.log")) as f:
            return r, f.read()

    def test_a_missing_gradient_is_a_value_error_and_ends_the_job(self):
        r, log = self.failed_run("broken", BROKEN)
        self.assertIn("ScriptValueError: parameter 0 ((4, 8)) has no gradient", log)
        # No restart fixes it: the job fails (before: "a restart may fix", and a launcher's
        # --max_restarts restarted into the same error). The launcher names worker 1: by
        # its exit, or by worker 0's exit, whose reason is worker 1's report.
        self.assertRegex(r.stderr + r.stdout,
                         r"worker 1 exited with code 78|worker 1 \([^)]+\) failed in step "
                         r"\d+, which no restart fixes: the script raised ScriptValueError: "
                         r"parameter 0")

    def test_a_parameter_given_memory_of_its_own_is_an_error(self):
        # p.data replaced after the first step (model surgery, a .to() or .half() after the
        # optimizer was built): the optimizer would step its buffer while the model used the
        # new tensor, training nothing from then on. Now a RuntimeError naming it.
        _, log = self.failed_run("moved", MOVED)
        self.assertIn("RuntimeError: parameter 0 ((4, 8)) got memory of its own", log)

    def test_a_config_that_disagrees_with_the_model(self):
        tmp = tempfile.mkdtemp(prefix="onebit-mismatch-")
        r = launch(tmp, job_config("OneBitAdam", {"lr": 0.001}, parameters=1000, steps=5),
                   [self.script(tmp, BROKEN), "{config}"], timeout=120)
        self.assertNotEqual(r.returncode, 0)
        # Both workers find the mismatch; whichever exits first ends the job (the launcher
        # stops the other, maybe before it got there), and the launcher names its last line.
        # The job failed at once: 78, do not restart (coordinator/member.h).
        self.assertEqual(r.returncode, 78, r.stderr[-3000:])
        self.assertRegex(r.stderr + r.stdout,
                         r"the job FAILED: worker [01] exited with code 78 \(.*has a model of "
                         r"41 parameters; the job's has 1000 \(the job config's\)")

    def test_a_diverged_loss_fails_the_job_at_once_naming_the_worker(self):
        # Worker 1's loss turns NaN at step 3, as a diverged training's does. It would again
        # after every restart: the job fails at once (no heartbeat timeouts, no restarts),
        # every process exits 78, and the reason names the worker and the step.
        tmp = tempfile.mkdtemp(prefix="onebit-diverged-")
        config = job_config("OneBitAdam", {"lr": 0.001, "freeze_step": 5},
                            parameters=8 * 4 + 4 + 4 + 1, steps=50)
        config["onebit"]["failure"] = {"max_restarts": 3, "heartbeat_timeout_s": 10}
        start = time.monotonic()
        r = launch(tmp, config, [self.script(tmp, DIVERGED), "{config}"], timeout=120)
        took = time.monotonic() - start
        out = r.stderr + r.stdout
        self.assertEqual(r.returncode, 78, out[-3000:])
        self.assertRegex(out, r"the job FAILED: worker [01] exited with code 78")
        self.assertNotIn("restarting it", out)
        self.assertLess(took, 30, out[-3000:])  # was 50 s: three restarts, 10 s timeouts each
        with open(os.path.join(tmp, "out", "onebit_adam", "coordinator.log")) as f:
            log = f.read()
        self.assertRegex(log, r"job FAILED: worker 1 \(\S+\) failed in step 3, which no restart "
                              r"fixes: training diverged: the loss is nan at step 3")
        self.assertNotIn("recovery 1", log)


if __name__ == "__main__":
    BIN = os.path.abspath(sys.argv.pop(1))
    sys.path.insert(0, os.path.join(BIN, "python"))
    sys.path.insert(0, os.path.dirname(HERE))
    unittest.main(verbosity=2)
