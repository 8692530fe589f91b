"""torchaudio's Kaldi-compatible filterbanks with the options of attnbench's
(experiments/tasks/speech/fbank.h), for the fixture and the whole-utterance check. Needs
torch and torchaudio (Debian python3-torchaudio) and numpy."""
import wave

import numpy as np

# Every option of torchaudio.compliance.kaldi.fbank that attnbench fixes, written out
# (several differ from torchaudio's defaults: num_mel_bins 23, energy_floor 1).
OPTIONS = dict(
    num_mel_bins=40, frame_length=25.0, frame_shift=10.0, sample_frequency=16000.0,
    dither=0.0, energy_floor=0.0, preemphasis_coefficient=0.97, remove_dc_offset=True,
    window_type="povey", round_to_power_of_two=True, snip_edges=True,
    low_freq=20.0, high_freq=0.0, use_energy=False, use_log_fbank=True, use_power=True,
    raw_energy=True, htk_compat=False, subtract_mean=False, vtln_warp=1.0)


def read_wav16(path):
    """The samples of a 16-bit mono WAV as float64 at integer scale (as Kaldi reads
    them; torchaudio.load would scale them to [-1, 1))."""
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1:
            raise ValueError(f"{path}: not 16-bit mono")
        rate = w.getframerate()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)
    return x, rate


def fbank(x, rate=16000, dtype="float64"):
    """torchaudio's fbank of the samples x, computed in `dtype` (float64: the exact
    values to float64 rounding; float32: what torchaudio gives by default)."""
    import torch
    import torchaudio
    t = torch.tensor(x, dtype=getattr(torch, dtype)).unsqueeze(0)
    return torchaudio.compliance.kaldi.fbank(t, **dict(OPTIONS, sample_frequency=float(rate))).numpy()
