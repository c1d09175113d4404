"""Audio bounds: a WAV header that says 1 Hz (400 KB resampled to 16 kHz would be 3.2e9 samples, ~13 GB), a clip
longer than attnlab reads, a file that decodes into more samples than it takes: one DataError naming the file, from
the header, before anything is decoded or resampled."""

from __future__ import annotations

import wave

import numpy as np
import pytest

pytest.importorskip("soundfile")
pytest.importorskip("librosa")

from attnlab.core.errors import DataError
from attnlab.data import audio
from attnlab.data.audio import FrontEnd, log_mel, read_audio


def write_pcm(path, rate: int, n: int, channels: int = 1):
    """A 16-bit PCM WAV of ``n`` frames of noise at ``rate`` Hz, written with the standard library (any rate)."""
    samples = (np.random.default_rng(0).standard_normal(n * channels) * 1000).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return path


def test_a_header_of_1_hz_is_refused_before_resampling(tmp_path, monkeypatch):
    clip = write_pcm(tmp_path / "one-hertz.wav", rate=1, n=200_000)  # 400 KB
    monkeypatch.setattr("librosa.resample", lambda *a, **k: pytest.fail("resampled"))
    with pytest.raises(DataError, match=r"one-hertz\.wav has a sample rate of 1 Hz; attnlab reads audio at 1,000"):
        read_audio(clip)
    with pytest.raises(DataError, match="sample rate of 1 Hz"):  # samples given in memory: the same bound
        log_mel(np.zeros(200_000, np.float32), 1)
    with pytest.raises(DataError, match="sample rate of 1,000,000 Hz"):
        log_mel(np.zeros(1000, np.float32), 1_000_000)


def test_a_clip_longer_than_the_limit_is_refused(tmp_path):
    clip = write_pcm(tmp_path / "long.wav", rate=1000, n=(audio.MAX_SECONDS + 1) * 1000)
    with pytest.raises(DataError, match=rf"long\.wav lasts {audio.MAX_SECONDS + 1} s; .* at most"):
        read_audio(clip)


def test_a_file_that_decodes_into_too_many_samples_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(audio, "MAX_DECODED", 10_000)  # a compressed file of silence can hold billions
    clip = write_pcm(tmp_path / "wide.wav", rate=8000, n=4000, channels=4)
    with pytest.raises(DataError, match=r"wide\.wav holds 16,000 samples \(4 channels\)"):
        read_audio(clip)


def test_clips_within_the_bounds_are_read(tmp_path):
    for rate in (audio.MIN_RATE, 8000, 44_100):
        x, got = read_audio(write_pcm(tmp_path / f"{rate}.wav", rate=rate, n=rate // 2))
        assert got == rate and x.shape == (rate // 2,)
        assert log_mel(x, got, FrontEnd(seconds=0.5)).shape == (FrontEnd(seconds=0.5).n_frames, 40)
