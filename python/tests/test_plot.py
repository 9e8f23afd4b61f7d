"""rotary.plot: every figure's data describes the model it is given (its own schedule, factor,
original and extended lengths), ``--compare`` draws a second config on the same axes, the monotone
schedule is cited; the drawing runs on matplotlib's Agg backend."""
import json
import math
import pathlib

import numpy as np
import pytest

import rotary
from rotary import Rope, _rotary, plot

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "tests" / "conformance" / "configs"


def config(name):
    return str(CONFIGS / f"{name}.json")


# (config, preset, factor, original length, the model's own length, how its config states it): the
# models and lengths of test_cli's InfoDriftIsAtTheModelsLastPosition, `rotary info`'s drift line.
LENGTHS = [
    ("Qwen--Qwen2.5-7B-Instruct", "qwen2.5-7b-instruct", 4.0, 32768, 131072, "factor 4 x original length 32768"),
    ("meta-llama--Llama-3.1-8B", "llama-3.1-8b", 8.0, 8192, 131072, "max_position_embeddings"),
    ("meta-llama--Llama-3.2-1B", "llama-3.2-1b", 32.0, 8192, 131072, "max_position_embeddings"),  # not 32 x 8192
    ("microsoft--Phi-3.5-mini-instruct", "phi-3.5-mini-instruct", 32.0, 4096, 131072, "max_position_embeddings"),
    ("deepseek-ai--DeepSeek-V3", "deepseek-v3", 40.0, 4096, 163840, "max_position_embeddings"),
    ("meta-llama--Meta-Llama-3-8B", "llama-3-8b", None, 8192, 8192, "max_position_embeddings"),
    ("google--gemma-3-4b-it", "gemma-3-4b-it", 8.0, 131072, 131072, "max_position_embeddings"),  # text_config, linear
]


@pytest.fixture(scope="module")
def llama31():
    return plot.load_model(config=config("meta-llama--Llama-3.1-8B"))


@pytest.fixture(scope="module")
def qwen25():
    return plot.load_model(config=config("Qwen--Qwen2.5-7B-Instruct"))


@pytest.mark.parametrize("name, preset, factor, original, context, source", LENGTHS)
def test_a_model_has_its_configs_own_factor_and_lengths(name, preset, factor, original, context, source):
    # The plots took the lengths from the top-level keys: Qwen2.5's YaRN at 32768 (its context is 4 x
    # 32768), Gemma 3 at 4096 (its lengths are in text_config).
    for model in (plot.load_model(config=config(name)), plot.load_model(preset=preset)):
        assert (model.factor, model.original, model.context, model.context_source) == \
            (factor, original, context, source)
    assert plot.load_model(config=config(name)).name == name


def test_model_lengths_follow_how_the_settings_state_them():
    yarn = Rope(64, schedule="yarn", factor=4.0, original_max_position=32768)
    assert plot.model_lengths(yarn, 32768) == (4.0, 32768, 131072, "factor 4 x original length 32768")
    assert plot.model_lengths(yarn, 131072) == (4.0, 32768, 131072, "max_position_embeddings")
    llama3 = Rope(64, schedule="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position=8192)
    assert plot.model_lengths(llama3) == (8.0, 8192, 65536, "factor 8 x original length 8192")
    for factor in (1e300, 1.7e308):  # the second's product with 4096 overflows to inf
        huge = Rope(64, schedule="yarn", factor=factor, original_max_position=4096)
        assert plot.model_lengths(huge)[2] == 2 ** 62  # as `rotary info` caps it
    # linear states no original length: the model's is its max_position_embeddings
    assert plot.model_lengths(Rope(64, schedule="linear", factor=4.0), 4096) == (4.0, 4096, 4096,
                                                                                 "max_position_embeddings")
    assert plot.model_lengths(Rope(64, schedule="monotone", max_length=100)) == (None, 100, 100, "max_length")
    assert plot.model_lengths(Rope(64)) == (None, 0, 0, "max_position_embeddings")  # states none


def test_schedule_figure_is_drawn_at_the_models_factor(llama31, qwen25):
    # Llama-3.1 was drawn at factor 16 (= 131072 / 8192, the ratio of its lengths): its factor is 8.
    figure = plot.schedule_figure([llama31])
    assert "factor 8, L = 8192" in figure.title and "16" not in figure.title
    series = {s.label: s.y for s in figure.series}
    own = series["meta-llama--Llama-3.1-8B (llama3, factor 8): its own"]
    np.testing.assert_array_equal(series["Llama 3 at factor 8, L = 8192"], own)
    assert own.min() == pytest.approx(1 / 8, rel=1e-15)
    np.testing.assert_allclose(series["linear (PI) at factor 8, L = 8192"], 1 / 8, rtol=1e-15)
    # Qwen2.5's YaRN: factor 4 and L = 32768 (was drawn at an illustrative factor 2).
    series = {s.label: s.y for s in plot.schedule_figure([qwen25]).series}
    np.testing.assert_array_equal(series["YaRN at factor 4, L = 32768"],
                                  series["Qwen--Qwen2.5-7B-Instruct (yarn, factor 4): its own"])
    # A model without a factor is drawn at an illustrative one, and the title says so.
    default = plot.load_model(preset="llama-3-8b")
    assert plot.schedule_factor(default) == (2.0, False)
    assert "illustrative factor (llama-3-8b has none) 2" in plot.schedule_figure([default]).title


def test_longrope_is_drawn_with_the_factors_of_its_own_length():
    phi = plot.load_model(config=config("microsoft--Phi-3.5-mini-instruct"))
    with open(config("microsoft--Phi-3.5-mini-instruct"), encoding="utf-8") as f:
        long_factor = np.array(json.load(f)["rope_scaling"]["long_factor"])
    np.testing.assert_allclose(plot.wavelengths(phi.rope)[2], 1 / long_factor, rtol=1e-14)


def test_wavelength_figure_marks_the_models_lengths(qwen25):
    figure = plot.wavelength_figure([qwen25])
    assert [(line.at, line.label) for line in figure.hlines] == [
        (32768, "Qwen--Qwen2.5-7B-Instruct: original context 32768"),
        (131072, "Qwen--Qwen2.5-7B-Instruct: context 131072 (factor 4 x original length 32768)")]
    wavelength = {s.label: s.y for s in figure.series}["Qwen--Qwen2.5-7B-Instruct (yarn, factor 4) wavelength"]
    np.testing.assert_array_equal(wavelength, 2 * math.pi / qwen25.rope.inv_freq)


def test_wrap_figure_spans_the_models_context(qwen25):
    figure = plot.wrap_figure([qwen25])
    model_pair, monotone = figure.series
    assert model_pair.x[0] == 0 and model_pair.x[-1] == 131071  # was a fixed 64-token window
    assert [line.at for line in figure.vlines] == [131071]
    assert "first wraps at distance 7" in model_pair.label  # Qwen2.5 keeps pair 0 at θ = 1
    np.testing.assert_array_equal(model_pair.y, np.mod(model_pair.x * qwen25.rope.inv_freq[0], 2 * math.pi))
    assert "monotone (He & Xu) for its 131072-token context" in monotone.label
    theta = plot.monotone_rope(qwen25).inv_freq[0]
    assert 131071 * theta < 2 * math.pi
    np.testing.assert_array_equal(monotone.y, monotone.x * theta)  # never wraps: no mod taken
    assert np.all(np.diff(monotone.y) > 0)
    # A short window is drawn at every distance.
    tiny = plot.Model("tiny", Rope(8), None, 64, 64, "max_position_embeddings")
    short = plot.wrap_figure([tiny]).series[0]
    np.testing.assert_array_equal(short.x, np.arange(64))
    assert plot.first_drop(short.y) == 7 == plot.first_wrap(1.0, 64)
    assert plot.first_wrap(1.0, 7) is None


def test_he_and_xu_are_cited():
    assert plot.HE_XU == 'He & Xu, "A Simple Derivation of RoPE for LLMs"'
    assert plot.HE_XU in " ".join(plot.__doc__.split())
    assert plot.HE_XU_LINK.startswith("https://arxiv.org/") and plot.HE_XU_LINK in plot.__doc__
    tiny = plot.Model("tiny", Rope(8), None, 64, 64, "max_position_embeddings")
    assert plot.HE_XU in plot.wrap_figure([tiny]).title


@pytest.mark.parametrize("name, preset, factor, original, context, source", LENGTHS[:4])
def test_float32_drift_is_at_the_models_last_position(name, preset, factor, original, context, source):
    # What `rotary info` prints (test_cli's InfoDriftIsAtTheModelsLastPosition): the library's drift at
    # the model's last position, with the schedule it uses at that length.
    model = plot.load_model(preset=preset)
    at_length = Rope.from_preset(preset, seq_len=context)
    assert plot.float32_drift(model) == (context - 1, *_rotary.float32_drift(at_length._impl, context - 1))
    # Figure 5's float32 curve meets it there (the stored cos/sin add at most a float32 rounding).
    err32, _ = plot.angle_errors(model.rope, np.array([context - 1]))
    assert err32[0] == pytest.approx(plot.float32_drift(model)[1], abs=2.0 ** -22)
    far = plot.Model("far", Rope(8), None, 1, 2 ** 40, "")
    assert plot.float32_drift(far)[0] == 2 ** 31 - 1  # rotary's last position


def test_longrope_drift_uses_the_long_factors():
    phi = plot.load_model(preset="phi-3.5-mini-instruct")
    short = Rope.from_preset("phi-3.5-mini-instruct")
    assert plot.float32_drift(phi)[1] != _rotary.float32_drift(short._impl, 131071)[0]


def test_float32_figure_marks_the_models_last_position():
    tiny = plot.Model("tiny", Rope(8), None, 4096, 4096, "max_position_embeddings")
    figure = plot.float32_figure([tiny])
    angle = plot.float32_drift(tiny)[1]
    assert [(line.at, line.label) for line in figure.vlines] == [
        (4095, f"tiny: last position 4095 (max_position_embeddings), float32 pipeline off by {angle:.3g} rad")]
    assert figure.series[0].x[-1] == 2 ** 24
    err32, err_rotary = plot.angle_errors(tiny.rope, plot.float32_positions([tiny]))
    np.testing.assert_array_equal(figure.series[1].y, np.maximum(err_rotary, 2.0 ** -60))
    long = plot.Model("long", Rope(8), None, 2 ** 27, 2 ** 27, "max_position_embeddings")
    assert plot.float32_positions([long])[-1] == 2 ** 27  # past 2^24 when the model is longer
    assert plot.float32_positions([plot.Model("x", Rope(8), None, 1, 2 ** 40, "")])[-1] == 2 ** 31 - 1


def test_doctor_figure_draws_the_doctors_report(llama31):
    figure = plot.doctor_figure([llama31])
    report = rotary.doctor(config("meta-llama--Llama-3.1-8B"), context=131072)
    assert plot.doctor_report(llama31) == report  # the library's report at the model's own context
    wrap, strays = figure.series
    np.testing.assert_array_equal(wrap.y, np.ceil(2 * math.pi / llama31.rope.inv_freq))  # ceil(2π/θ_i)
    assert wrap.y[0] == 7
    wrapping = int(np.sum(wrap.y <= 131071))
    assert f"({wrapping} of 64 pairs wrap inside the context)" in wrap.label and wrapping == len(report["wrapping_pairs"])
    first = report["float32_drift"]["first_position_per_pair"]
    assert list(strays.x) == [j for j, p in enumerate(first) if p is not None] and 0 not in strays.x
    assert strays.y.min() == report["float32_drift"]["first_position"] and strays.y.max() < 131072
    bf16 = report["bf16_resolution"]["first_position"]
    assert [line.at for line in figure.hlines] == [131072, bf16]
    assert figure.hlines[0].label == "meta-llama--Llama-3.1-8B: context 131072 (max_position_embeddings)"
    assert f"cannot tell position {bf16} from {bf16 + 1}" in figure.hlines[1].label
    # Pairs that never turn (proportional RoPE's tail) have no wrap distance: a gap, not a zero.
    tail = plot.Model("tail", Rope(16, schedule="proportional", partial_rotary_factor=0.25), None, 3000, 3000, "")
    y = plot.doctor_figure([tail]).series[0].y
    assert np.isfinite(y[:2]).all() and np.isnan(y[2:]).all()


def test_compare_puts_both_models_in_every_figure(llama31, qwen25):
    figures = plot.figures([llama31, qwen25])
    assert [f.file for f in figures] == ["1_long_term_decay.png", "2_angle_difference_wrap.png", "3_wavelengths.png",
                                         "4_schedule_ratios.png", "5_float32_angle_error.png",
                                         "6_precision_doctor.png"]
    for figure in figures:
        labels = " ".join(s.label for s in figure.series)
        assert "meta-llama--Llama-3.1-8B" in labels and "Qwen--Qwen2.5-7B-Instruct" in labels, figure.file
    wavelength = {s.label: s.y for s in figures[2].series}
    for model in (llama31, qwen25):
        np.testing.assert_array_equal(wavelength[f"{plot._describe(model)} wavelength"],
                                      2 * math.pi / model.rope.inv_freq)
    assert [line.at for line in figures[2].hlines] == [8192, 131072, 32768, 131072]
    own = {s.label: s.y for s in figures[3].series}
    assert set(own) >= {"meta-llama--Llama-3.1-8B (llama3, factor 8): its own",
                        "Qwen--Qwen2.5-7B-Instruct (yarn, factor 4): its own"}


def test_main_draws_a_config_and_its_comparison(tmp_path, capsys):
    out = tmp_path / "figures"
    assert plot.main(["--config", config("meta-llama--Llama-3.1-8B"), "--compare",
                      config("mistralai--Mistral-7B-v0.1"), "--out", str(out)]) == 0
    files = sorted(p.name for p in out.iterdir())
    assert files == ["1_long_term_decay.png", "2_angle_difference_wrap.png", "3_wavelengths.png",
                     "4_schedule_ratios.png", "5_float32_angle_error.png", "6_precision_doctor.png"]
    assert all((out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in files)
    assert capsys.readouterr().out.split() == [str(out / name) for name in files]


def test_main_errors_are_one_line(tmp_path, capsys):
    missing = str(tmp_path / "none.json")
    assert plot.main(["--preset", "llama-3.1-8b", "--compare", missing, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rotary.plot: error: ") and err.count("\n") == 1 and "none.json" in err
    assert plot.main(["--preset", "no-such-model", "--out", str(tmp_path)]) == 2
    assert "no-such-model" in capsys.readouterr().err
    with pytest.raises(TypeError, match="exactly one of preset and config"):
        plot.load_model()
    with pytest.raises(TypeError, match="exactly one of preset and config"):
        plot.load_model(preset="llama-3.1-8b", config=config("meta-llama--Llama-3.1-8B"))
    assert not list(tmp_path.iterdir())  # nothing drawn


# ---- long contexts, and the command lines' bad arguments ----------------------------------------

def _long_config(tmp_path, name, context, **scaling):
    """A Llama config of ``context`` positions (rope_scaling given as keywords)."""
    config = {"hidden_size": 256, "num_attention_heads": 4, "rope_theta": 10000.0, "model_type": "llama",
              "max_position_embeddings": context}
    if scaling:
        config["rope_scaling"] = scaling
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


@pytest.mark.parametrize("context", [2 ** 30 + 1, 2 ** 31, 2 ** 33])
@pytest.mark.parametrize("scaling", [{}, {"rope_type": "linear", "factor": 4.0}, {"rope_type": "dynamic", "factor": 4.0}],
                         ids=["default", "linear", "dynamic"])
def test_figures_describe_contexts_beyond_2_to_the_30(tmp_path, context, scaling):
    # Figure 4's LongRoPE illustration asked for factor x L > 2^31 positions (a model of 2^30 + 1
    # tokens, factor 2), figure 2's monotone schedule for more than 2^31: both raised.
    model = plot.load_model(config=_long_config(tmp_path, "long", context, **scaling))
    figures = {f.file: f for f in plot.figures([model])}
    ratios = {s.label.split(" at factor")[0]: s.y for s in figures["4_schedule_ratios.png"].series}
    factor = plot.schedule_factor(model)[0]
    half = model.rope.rotary_dim // 2
    np.testing.assert_allclose(ratios["LongRoPE (long factors 1..s)"], 1 / np.linspace(1.0, factor, half), rtol=1e-15)
    monotone = [s for s in figures["2_angle_difference_wrap.png"].series if "monotone" in s.label]
    span = f"its {context}-token context" if context <= 2 ** 31 else "2^31 positions"
    assert monotone[0].label.startswith(f"long: monotone (He & Xu) for {span} (θ = ")


def test_first_wrap_computes_only_the_last_distances():
    # first_wrap built the whole curve, 2π/θ distances (26 GB for θ = 2^-28 in a 2^31 window), to find
    # its first drop, which the last distances hold.
    import tracemalloc
    tracemalloc.start()
    try:
        wrap = plot.first_wrap(2.0 ** -20, 2 ** 31)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    d = math.ceil(2 * math.pi * 2 ** 20)  # the first distance whose angle d·θ reaches 2π
    assert wrap == d and (d * 2.0 ** -20) % (2 * math.pi) < ((d - 1) * 2.0 ** -20) % (2 * math.pi)
    assert peak < 1 << 20, f"{peak} bytes to find one wrap"
    assert plot.first_wrap(1.0, 7) is None and plot.first_wrap(1.0, 8) == 7  # 7 rad > 2π > 6 rad
    assert plot.first_wrap(0.0, 100) is None


def test_main_draws_a_model_of_more_than_2_to_the_30_tokens(tmp_path, capsys):
    out = tmp_path / "figures"
    assert plot.main(["--config", _long_config(tmp_path, "long", 2 ** 30 + 1), "--out", str(out)]) == 0
    assert len(capsys.readouterr().out.split()) == 6 and len(list(out.iterdir())) == 6


def test_main_names_an_output_folder_it_cannot_write(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    for out, problem in ((blocker, "is a file, not a folder"), (blocker / "sub", "cannot be made: Not a directory")):
        assert plot.main(["--preset", "llama-3.1-8b", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err == f"rotary.plot: error: --out {str(out)!r} {problem}\n"


def test_report_names_its_bad_arguments_in_one_line(tmp_path, capsys):
    from rotary import report
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    cases = [
        (["--cli", str(tmp_path / "none"), "--out", str(tmp_path / "r")],
         f"--cli {str(tmp_path / 'none')!r} cannot be run: No such file or directory"),
        (["--cli", "true", "--out", str(blocker)], f"--out {str(blocker)!r} is a file, not a folder"),
        (["--cli", "true", "--out", str(tmp_path / "r"), "--extra", str(tmp_path / "none.txt")],
         f"--extra {str(tmp_path / 'none.txt')!r} is not a file"),
        (["--cli", "true", "--preset", "no-such-model", "--out", str(tmp_path / "r")],
         "--preset: preset 'no-such-model' is unknown"),
    ]
    for argv, message in cases:
        assert report.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"rotary.report: error: {message}") and err.count("\n") == 1, err


def _rotary_command():
    """The developer's `rotary-dev` (its demo) of the CMake build (it is not installed)."""
    import shutil
    candidate = pathlib.Path(__file__).resolve().parents[2] / "build" / "rotary-dev"
    if candidate.is_file():
        return str(candidate)
    return shutil.which("rotary-dev")


def test_report_shows_every_figure_with_its_caption(tmp_path):
    # `make run`'s last step: every figure plot_all draws gets a line and a caption in report.md.
    from rotary import report
    command = _rotary_command()
    if command is None:
        pytest.skip("no `rotary-dev` command built")
    assert report.main(["--cli", command, "--out", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    figures = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert len(figures) == 6
    for name in figures:
        line = f"![{name}](figures/{name})"
        assert line in text
        caption = text.split(line, 1)[1].strip().split("\n", 1)[0]
        assert caption and not caption.startswith("!["), name
