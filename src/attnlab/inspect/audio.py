"""Attention over time for an encoder trained on audio frames: which 10 ms frames the [CLS] token reads.

For one clip x -> log-mel frames F (T, n_mels) (``data/audio.py``) and an encoder with a [CLS] token:

    a_l[t] = mean_h P_l^h[cls, 1 + t]          layer l's attention of [CLS] to frame t, heads averaged
    r[t]   = R[cls, 1 + t] / sum_t' R[cls, 1 + t']   rollout (inspect/rollout.py), over the frames only

The figure stacks the waveform, the log-mel spectrogram and these curves on one time axis (seconds,
frame t at t * 10 ms), so a reader sees whether attention sits on the spoken word or on the noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.core.errors import ConfigError
from attnlab.inspect.rollout import attention_rollout
from attnlab.nn.hooks import capture


@torch.no_grad()
def attention_over_time(model: torch.nn.Module, frames: torch.Tensor) -> dict[str, Any]:
    """frames (T, n_mels) -> per_layer (L, T) [CLS] attention to each frame (heads averaged), rollout (T,),
    probs (n_classes,)."""
    model.eval()
    with capture(model, "blocks.*.mixer.hook_pattern") as seen:
        out = model(features=frames[None])
    probs = list(seen.values())  # L x (1, H, 1 + T, 1 + T)
    per_layer = torch.stack([p[0].mean(0)[0, 1:] for p in probs])  # (L, T)
    r = attention_rollout(probs)[0, 0, 1:]
    return {"per_layer": per_layer, "rollout": r / r.sum(), "probs": out.predictions[0].softmax(-1)}


def inspect_audio(run_dir: str | Path, audio_path: str | Path, out_path: str | Path) -> dict[str, Any]:
    """Classify one sound file with an encoder run trained on audio and write the attention-over-time PNG.
    Returns the class, its probability, the time (s) where rollout peaks, and the figure's path."""
    from attnlab.data.audio import HOP, SAMPLE_RATE, FrontEnd, fit_length, log_mel, read_audio
    from attnlab.inspect.figure_path import check_figure_path
    from attnlab.inspect.plots import finish_figure
    from attnlab.models.registry import from_pretrained
    from attnlab.training.tasks.continuous import INPUTS_FILE, ContinuousTask

    check_figure_path(out_path, "--out")  # before the model runs
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"run folder not found: {run_dir}")
    if not (run_dir / INPUTS_FILE).is_file():  # a text or image run: no front end of features to read
        raise ConfigError(f"{run_dir} was not trained on audio (it has no {INPUTS_FILE}); --audio needs a run of "
                          "speech-words or data=WAV_FOLDER")
    saved = ContinuousTask._load_inputs(run_dir)
    if not saved.get("audio"):
        raise ConfigError(f"{run_dir} was not trained on audio; --audio needs a run of speech-words or data=WAV_FOLDER")
    model = from_pretrained(run_dir)
    c = model.config
    if c.family != "encoder" or c.pooling != "cls" or saved["classes"] == []:
        raise ConfigError(f"--audio draws a [CLS] token's attention: it needs an encoder run with pooling=cls and "
                          f"a classification head; this is a {c.family} run")
    front = FrontEnd(**saved["audio"])
    x, rate = read_audio(Path(audio_path))
    frames = torch.from_numpy(log_mel(x, rate, front))
    att = attention_over_time(model, frames)
    k = int(att["probs"].argmax())
    T = frames.shape[0]
    t = np.arange(T) * HOP / SAMPLE_RATE  # seconds

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # not pyplot's: a notebook keeps its own backend

    if rate != SAMPLE_RATE:
        import librosa

        x = librosa.resample(x, orig_sr=rate, target_sr=SAMPLE_RATE)
    wave = fit_length(x, round(front.seconds * SAMPLE_RATE))
    L = att["per_layer"].shape[0]
    fig = Figure(figsize=(7, 6), dpi=110)
    FigureCanvasAgg(fig)  # drawn and measured by Agg, as the PNG is written
    axes = fig.subplots(3, 1, sharex=True, gridspec_kw={"height_ratios": [1, 1.6, 1.6]})
    axes[0].plot(np.arange(len(wave)) / SAMPLE_RATE, wave, lw=0.4, color="black")
    axes[0].set_ylabel("waveform")
    axes[1].imshow(frames.T.numpy(), origin="lower", aspect="auto", cmap="magma",
                   extent=(0, T * HOP / SAMPLE_RATE, 0, front.n_mels))
    axes[1].set_ylabel("mel band")
    for layer in range(L):
        axes[2].plot(t, att["per_layer"][layer].numpy(), lw=1, alpha=0.7, label=f"layer {layer}")
    axes[2].plot(t, att["rollout"].numpy(), lw=2, color="black", label="rollout")
    axes[2].set_ylabel("[CLS] attention")
    axes[2].set_xlabel("time (s), one frame per 10 ms")
    axes[2].legend(fontsize=7, ncol=min(L + 1, 5))
    title = f"{Path(audio_path).name}: {saved['classes'][k]} ({float(att['probs'][k]):.1%})"
    finish_figure(fig, out_path, title)
    return {"class": saved["classes"][k], "probability": float(att["probs"][k]),
            "rollout_peak_s": float(t[int(att["rollout"].argmax())]), "out": str(out_path)}
