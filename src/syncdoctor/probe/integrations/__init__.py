"""One-line attach points for training frameworks that own the loop:

- Lightning: `Trainer(callbacks=[SyncDoctorCallback(run_dir)])`
  (syncdoctor.probe.integrations.lightning)
- Hugging Face `Trainer`: `Trainer(..., callbacks=[SyncDoctorTrainerCallback(run_dir)])`
  (syncdoctor.probe.integrations.huggingface)

accelerate and hand-written loops need no integration: `syncdoctor.attach(model,
optimizer, run_dir=...)` after `accelerator.prepare` / the DDP wrapping (attach takes the
optimizer a framework wraps, too).

Each module imports its framework only when its class is used, so the package imports
without Lightning or transformers installed.
"""
