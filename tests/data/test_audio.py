"""Audio: eSpeak NG synthesis through the bundled library, log-mel frames that put a tone in its mel band at any
sample rate, the spoken-word generator (reproducible, unseen voices in the test split) and WAV folders as data."""

from __future__ import annotations

import numpy as np
import pytest

from attnlab.core.errors import DataError
from attnlab.data import audio as A
from attnlab.data import espeak, spoken
from attnlab.data.continuous import read_continuous

librosa = pytest.importorskip("librosa")


def test_espeak_speaks_each_word_differently_and_refuses_bad_settings():
    a, b = espeak.synthesize("left", "en+m3", 160, 50), espeak.synthesize("right", "en+m3", 160, 50)
    assert espeak.sample_rate() == 22050
    assert 0.15 * 22050 < len(a) < 1.0 * 22050 and np.abs(a).max() > 0.1  # about a third of a second of speech
    assert not np.array_equal(a[: len(b)], b[: len(a)])
    slow, fast = espeak.synthesize("left", "en+m3", 100, 50), espeak.synthesize("left", "en+m3", 300, 50)
    assert len(slow) > 1.5 * len(fast)  # the rate is honoured
    with pytest.raises(DataError, match="no voice"):
        espeak.synthesize("left", "xx-nonexistent")
    with pytest.raises(DataError, match="rate"):
        espeak.synthesize("left", "en", rate=10)


def test_a_list_of_utterances_renders_the_same_samples_every_time():
    items = [("stop", "en-us+f2", 200, 30), ("go", "en+klatt", 140, 70)] * 2  # f2 breathes: noise from rand()
    first, rate = espeak.synthesize_many(items)
    espeak.synthesize("left", "en+m3")  # history in this process does not matter: each list runs in a fresh one
    again, _ = espeak.synthesize_many(items)
    assert rate == 22050 and all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert len(first[0]) > 0 and len(first[0]) != len(first[1])  # two different utterances


@pytest.mark.parametrize("rate", [16000, 22050, 44100])
def test_a_tone_lands_in_its_mel_band_at_every_sample_rate(rate):
    t = np.arange(rate) / rate
    noise = 1e-3 * np.random.default_rng(0).standard_normal(rate)
    tone = np.where(t >= 0.5, 0.5 * np.sin(2 * np.pi * 1000.0 * t), 0.0) + noise
    f = A.log_mel(tone, rate)  # 0.5 s of faint noise, then a 1 kHz tone
    assert f.shape == (101, 40) and f.dtype == np.float32
    centres = librosa.mel_frequencies(n_mels=42, fmax=8000)[1:-1]  # the 40 triangles' centres
    rise = f[60:95].mean(0) - f[5:45].mean(0)  # (40,): how much each band grew when the tone began
    assert abs(int(np.argmax(rise)) - int(np.argmin(abs(centres - 1000.0)))) <= 1
    assert np.abs(f.mean(0)).max() < 1e-4 and abs(float(f.std()) - 1) < 1e-3  # normalised per utterance


def test_clips_are_centre_cropped_or_padded_to_the_front_end_length():
    x = np.arange(10.0)
    assert A.fit_length(x, 4).tolist() == [3, 4, 5, 6]
    assert A.fit_length(x, 14).tolist() == [0, 0, *range(10), 0, 0]
    assert A.FrontEnd(seconds=0.5).n_frames == 51 == A.log_mel(np.zeros(16000), 16000, A.FrontEnd(0.5)).shape[0]


def test_generated_words_are_reproducible_and_the_test_split_has_new_voices():
    waves, words, held, voices = spoken.generate(60, 3)
    again = spoken.generate.__wrapped__(60, 3)
    assert np.array_equal(waves, again[0]) and words == again[1]
    assert waves.shape == (60, 16000) and waves.dtype == np.float32 and np.abs(waves).max() <= 1
    assert held.sum() == 12 and held[-12:].all()
    train_speakers = {v.split("+")[1] for v, h in zip(voices, held) if not h}
    test_speakers = {v.split("+")[1] for v, h in zip(voices, held) if h}
    assert train_speakers <= set(spoken.TRAIN_VARIANTS) and test_speakers <= set(spoken.TEST_VARIANTS)
    assert not train_speakers & test_speakers
    assert set(words) == set(spoken.WORDS) and set(np.array(words)[held]) == set(spoken.WORDS)
    other = spoken.generate.__wrapped__(60, 4)[0]
    assert not np.array_equal(waves, other)
    with pytest.raises(DataError, match="n >= 20"):
        spoken.generate.__wrapped__(5, 0)


def test_wav_folders_are_read_as_frames_with_their_own_test_split(tmp_path):
    counts = spoken.write_folder(tmp_path / "sw", 40, 0)
    assert counts == {"train": 30, "test": 10, "words": 10}  # at least one test clip per word
    data = read_continuous(str(tmp_path / "sw"))
    assert data.features.shape == (40, 101, 40) and data.held_out.sum() == 10 and data.front == A.FrontEnd()
    waves, words, held, _ = spoken.generate(40, 0)
    order = sorted(range(40), key=lambda i: (bool(held[i]), words[i], i))  # train/ then test/, by class, by file
    want = np.stack([A.log_mel(w, 16000) for w in waves[order]])
    diff = np.abs(data.features - want)  # 16-bit WAV rounding only: it shows in the quietest bands
    assert diff.mean() < 5e-3 and np.corrcoef(data.features.ravel(), want.ravel())[0, 1] > 0.9999, diff.max()
    flat = tmp_path / "flat"
    for word in ("yes", "no"):
        (flat / word).mkdir(parents=True)
        for i in range(3):
            A.write_wav(flat / word / f"{i}.wav", waves[i], 16000)
    flat_data = read_continuous(str(flat))
    assert flat_data.held_out is None and sorted(set(flat_data.targets)) == ["no", "yes"]


@pytest.mark.parametrize("layout,message", [("one-class", "2 class folders"), ("no-test", "no test/"),
                                            ("broken", "cannot read audio")])
def test_bad_wav_folders_are_one_clear_error(tmp_path, layout, message):
    root = tmp_path / layout
    if layout == "one-class":
        (root / "yes").mkdir(parents=True)
        A.write_wav(root / "yes" / "a.wav", np.zeros(1600), 16000)
    elif layout == "no-test":
        (root / "train" / "yes").mkdir(parents=True)
        A.write_wav(root / "train" / "yes" / "a.wav", np.zeros(1600), 16000)
    else:
        for word in ("yes", "no"):
            (root / word).mkdir(parents=True)
            (root / word / "a.wav").write_bytes(b"RIFF not a wave file")
    with pytest.raises(DataError, match=message):
        A.read_audio_folder(root)


def test_spoken_features_are_kept_on_disk_and_read_back_unchanged(tmp_path, monkeypatch):
    """The frames of generate(n, seed) are computed once per (n, seed, front end): a second call reads them from
    the cache folder, equal to the bit; another front end or seed is another file; a damaged file is redone."""
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    x, words, held = spoken.features(20, 5)
    assert x.shape == (20, 101, 40) and x.dtype == np.float32 and held.dtype == bool
    assert np.array_equal(x, np.stack([A.log_mel(w, 16000) for w in spoken.generate(20, 5)[0]]))
    (file,) = (tmp_path / "spoken").glob("*.npz")
    calls = []
    monkeypatch.setattr(spoken, "generate", lambda *a: calls.append(a) or pytest.fail("not read from the cache"))
    again = spoken.features(20, 5)
    assert np.array_equal(again[0], x) and again[1] == words and np.array_equal(again[2], held) and not calls
    monkeypatch.undo()
    monkeypatch.setenv("ATTNLAB_CACHE_DIR", str(tmp_path))
    assert spoken.features(20, 5, A.FrontEnd(n_mels=20))[0].shape == (20, 101, 20)
    assert not np.array_equal(spoken.features(20, 6)[0], x)  # another seed: other clips, kept beside
    assert len(list((tmp_path / "spoken").glob("*.npz"))) == 3 and not list((tmp_path / "spoken").glob("*.tmp*"))
    file.write_bytes(b"not an npz")
    redone = spoken.features(20, 5)
    assert np.array_equal(redone[0], x) and file.stat().st_size > 1000
