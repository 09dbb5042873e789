"""Pre-registered analysis plans: registered before the first run, refused when changed after it, evaluated by
`plelab report` (everything else labelled post hoc), and `plelab sweep --power` sizing a study from a pilot."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sweep_helpers import PLAN, VARIANTS, fake_study, study_file

from plelab.cli.main import main
from plelab.errors import PlelabError
from plelab.experiments.plan import evaluate_plan, load_plan, plan_hash, register_plan, registered_plan
from plelab.experiments.sweep import load_sweep
from plelab.experiments.sweep_runner import prepare
from plelab.experiments.sweep_store import SweepStore
from plelab.util.dataclass_config import ConfigError


def _plan_file(root: Path, margin: float = 0.02, comment: str = "") -> Path:
    path = root / "plan.toml"
    path.write_text(f'{comment}\n[plan]\nname = "t"\nmargin = {margin}\n[[plan.comparisons]]\nname = "a"\n'
                    'where = { "model.ple.dim" = 8 }\nreference_where = { "model.ple.dim" = 0 }\nmetric = "val"\n')
    return path


def _sweep_file(root: Path) -> Path:
    path = root / "sweep.toml"
    path.write_text(f'[sweep]\nout = "{root / "out"}"\nplan = "plan.toml"\n[base]\nmax_steps = 10\n'
                    '[base.model]\npreset = "tiny"\n[grid]\nseed = [1, 2]\n"model.ple.dim" = [0, 8]\n')
    return path


def test_the_plan_is_hashed_in_before_the_first_run_and_fixed_once_a_run_started(tmp_path, capsys):
    _plan_file(tmp_path)
    sweep = load_sweep(_sweep_file(tmp_path))
    assert sweep.options.plan == str((tmp_path / "plan.toml").resolve())  # relative to the sweep file
    store, _ = prepare(sweep)
    with store:
        record = registered_plan(store)
        assert record["runs_started_before"] == 0 and record["sha256"] == plan_hash(load_plan(tmp_path / "plan.toml"))
    # Comments and layout are not the plan: re-registering the same content is a no-op.
    _plan_file(tmp_path, comment="# a note")
    prepare(load_sweep(_sweep_file(tmp_path)))[0].close()
    # Before any run starts a plan may still change (re-registered) ...
    _plan_file(tmp_path, margin=0.03)
    prepare(load_sweep(_sweep_file(tmp_path)))[0].close()
    with SweepStore(sweep.db_path) as store:
        assert registered_plan(store)["plan"]["margin"] == 0.03
        store.mark_running(sweep.points[0].name, 12345)
    # ... after one has, a changed plan is refused in one line, before anything is trained.
    _plan_file(tmp_path, margin=0.05)
    with pytest.raises(PlelabError, match="changed after the first run started"):
        prepare(load_sweep(_sweep_file(tmp_path)))
    assert main(["sweep", str(tmp_path / "sweep.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a registered plan is fixed" in err[0]
    with SweepStore(sweep.db_path) as store:
        assert registered_plan(store)["plan"]["margin"] == 0.03


def test_a_plan_registered_after_runs_started_is_post_hoc(tmp_path):
    fake_study(tmp_path / "study", VARIANTS, plan=None)  # runs already done
    with SweepStore(tmp_path / "study" / "sweep.sqlite") as store:
        record = register_plan(store, load_plan(PLAN), "late.toml")
        assert record["runs_started_before"] == 6
    a = json.loads(_report_json(tmp_path / "study"))
    assert a["plan"]["status"] == "post hoc"


def _report_json(folder: Path, *extra: str) -> str:
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["report", str(folder), "--json", *extra]) == 0
    return buf.getvalue()


def test_report_computes_the_registered_verdicts_and_labels_the_rest_post_hoc(tmp_path):
    study = fake_study(tmp_path / "study", VARIANTS)
    a = json.loads(_report_json(study))
    assert a["plan"]["status"] == "registered"
    results = {r["name"]: r for r in a["plan"]["evaluation"]["results"]}
    val, macro = results["mglu_val"], results["mglu_macro"]
    assert val["outcome"] == "worse" and val["prediction"] == "hit" and val["decision"] == "MGLU costs loss here"
    assert val["test"]["n"] == 3 and val["test"]["p_used"] >= val["test"]["p"]  # Holm over the plan's two tests
    assert macro["outcome"] == "worse" and macro["prediction"] == "miss"         # 0.04 is outside the 0.02 margin
    assert a["margin"] == 0.02                                                    # the study rules use the plan's
    assert a["plan"]["power"]["comparisons"][0]["power"]["mde"] > 0
    md = (study / "report.md").read_text()
    assert "registered in the sweep database" in md and "is **post hoc**" in md
    # A plan given at report time that is not the registered one: its verdicts are post hoc.
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"plan": {**PLAN["plan"], "margin": 0.05}}))
    b = json.loads(_report_json(study, "--plan", str(other)))
    assert b["plan"]["status"] == "post hoc" and b["margin"] == 0.05
    none = fake_study(tmp_path / "none", VARIANTS, plan=None)
    c = json.loads(_report_json(none))
    assert c["plan"]["status"] == "none" and c["margin"] is None
    assert "No analysis plan was registered" in (none / "report.md").read_text()


def test_evaluate_plan_dose_response_and_holm():
    runs, evals = [], {}
    slopes = {1: -0.04, 2: -0.06, 3: -0.05}
    for seed in (1, 2, 3):
        for dim in (0, 1, 2, 4, 8):
            name = f"s{seed}d{dim}"
            runs.append({"name": name, "status": "done", "seed": seed, "point": {"model.ple.dim": dim, "seed": seed}})
            loss = 5.0 + 0.1 * seed + (slopes[seed] * dim.bit_length() if dim else 0.0)
            evals[name] = {"val": {"loss": loss}, "a": {"loss": loss + 1}, "b": {"loss": loss + 3}}
    plan = {"name": "dose", "dose_responses": [{"name": "dp", "metric": "val", "predicted": "better",
                                                "decisions": {"better": "PLE pays per doubling"}}],
            "comparisons": [{"name": "dp8", "where": {"model.ple.dim": 8}, "reference_where": {"model.ple.dim": 0},
                             "metric": "macro"}]}
    ev = evaluate_plan(plan, runs, evals)
    dp8, dose = ev["results"]  # comparisons first, then dose-responses
    assert dose["test"]["mean"] == pytest.approx(-0.05) and dose["outcome"] == "better"
    assert dose["prediction"] == "hit" and dose["decision"] == "PLE pays per doubling"
    assert dp8["test"]["mean"] == pytest.approx(4 * -0.05) and dp8["metric"] == "macro"


def test_bad_plans_are_refused_with_one_line():
    for bad, match in (({"plan": {"name": "x"}}, "at least one comparison"),
                       ({"plan": {"name": "x", "comparisons": [{"name": "a", "variant": "v"}]}}, "reference"),
                       ({"plan": {"name": "x", "alpha": 0.7, "comparisons": []}}, "alpha"),
                       ({"plan": {"name": "x", "comparisons": [{"name": "a", "variant": "v", "reference": "r",
                                                                "predicted": "smaller"}]}}, "predicted"),
                       ({"plan": {"name": "x", "comparisons": [{"name": "a", "variant": "v", "reference": "r",
                                                                "decisions": {"maybe": "?"}}]}}, "decision key"),
                       ({"other": {}}, "one \\[plan\\] table")):
        with pytest.raises(ConfigError, match=match):
            load_plan(bad)


def test_power_from_a_pilot(tmp_path, capsys):
    pilot = fake_study(tmp_path / "pilot", VARIANTS)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"sweep": {"out": str(tmp_path / "big"), "baseline": "swiglu", "plan": str(plan)},
                                 "base": {"model": {"preset": "tiny"}, "max_steps": 10},
                                 "grid": {"seed": [1, 2, 3, 4, 5]}, "variants": VARIANTS}))
    assert main(["sweep", str(sweep), "--power", "--pilot", str(pilot), "--json"]) == 0
    power = json.loads(capsys.readouterr().out)
    first = power["comparisons"][0]
    assert power["seeds"] == 5 and first["pilot_n"] == 3 and first["power"]["n"] == 5
    assert first["power"]["mde"] < 0.04 and first["power"]["seeds_for_effect"] >= 2
    assert not (tmp_path / "big").exists()  # nothing trained, nothing written
    assert main(["sweep", str(sweep), "--power"]) == 2  # no pilot folder yet: one line
    assert "run a pilot first" in capsys.readouterr().err


def _passes_study(harm_6: dict[int, float], harm_1: dict[int, float]) -> tuple[list, dict]:
    """Runs of none / random at two lengths, seeds 1-4: random's caption loss is none's plus the given harm."""
    runs, evals = [], {}
    for seed in harm_6:
        for length, harm in (("p6", harm_6), ("p1", harm_1)):
            base = 1.0 + 0.05 * seed + (0.3 if length == "p1" else 0.0)  # seeds and lengths differ a lot
            for arm, loss in (("none", base), ("random", base + harm[seed])):
                name = f"{arm}-{length}-{seed}"
                runs.append({"name": name, "status": "done", "seed": seed, "point": {"variant": f"{arm}-{length}"}})
                evals[name] = {"captions": {"loss": loss}}
    return runs, evals


INTERACTION_PLAN = {"name": "passes", "margin": 0.01, "comparisons": [
    {"name": "harm6", "variant": "random-p6", "reference": "none-p6", "metric": "captions"},
    {"name": "harm1", "variant": "random-p1", "reference": "none-p1", "metric": "captions"}],
    "interactions": [{"name": "grows", "of": "harm6", "minus": "harm1", "predicted": "worse",
                      "decisions": {"worse": "the harm grows with repetition"}}]}


def test_an_interaction_is_the_per_seed_difference_of_two_comparisons():
    # harm at 6 passes 0.016 + noise, at 1 pass 0.001 + other noise: the difference is per seed, not of the means
    harm6 = {1: 0.015, 2: 0.018, 3: 0.016, 4: 0.015}
    harm1 = {1: 0.000, 2: 0.003, 3: 0.001, 4: 0.000}
    ev = evaluate_plan(INTERACTION_PLAN, *_passes_study(harm6, harm1))
    h6, h1, grows = ev["results"]  # comparisons, then dose-responses, then interactions
    assert grows["kind"] == "interaction" and grows["metric"] == "captions"
    assert grows["per_seed"] == pytest.approx({s: harm6[s] - harm1[s] for s in harm6})
    assert grows["test"]["mean"] == pytest.approx(0.015)
    # per seed the difference is 0.015 exactly: a mean difference of 0.015 with s.e. 0 is resolved
    assert grows["outcome"] == "worse" and grows["prediction"] == "hit"
    assert grows["decision"] == "the harm grows with repetition"
    assert len(ev["results"]) == 3 and h1["test"]["mean"] == pytest.approx(0.001)
    # the same harm at both lengths: no interaction, and within the 0.01 margin it is equivalent
    same = evaluate_plan(INTERACTION_PLAN, *_passes_study(harm6, harm6))
    assert same["results"][2]["outcome"] == "equivalent" and same["results"][2]["prediction"] == "miss"


def test_an_interaction_counts_in_the_holm_family_and_in_the_power_estimate():
    runs, evals = _passes_study({1: 0.015, 2: 0.02, 3: 0.01, 4: 0.016}, {1: 0.0, 2: 0.004, 3: 0.001, 4: -0.002})
    ev = evaluate_plan(INTERACTION_PLAN, runs, evals)
    assert all(r["test"]["p_used"] >= r["test"]["p"] for r in ev["results"])
    assert max(r["test"]["p_used"] for r in ev["results"]) > min(r["test"]["p"] for r in ev["results"])
    from plelab.experiments.plan import plan_power
    power = plan_power(INTERACTION_PLAN, runs, evals, 5)
    assert [r["name"] for r in power["comparisons"]] == ["harm6", "harm1", "grows"]
    assert power["comparisons"][2]["pilot_n"] == 4 and power["comparisons"][2]["power"]["n"] == 5


def test_bad_interactions_are_refused_with_one_line():
    comps = INTERACTION_PLAN["comparisons"]
    for inter, match in (({"name": "i", "of": "harm6", "minus": "nope"}, "nope is not a registered comparison"),
                         ({"name": "i", "of": "harm6", "minus": "harm6"}, "two different"),
                         ({"name": "harm6", "of": "harm6", "minus": "harm1"}, "unique")):
        with pytest.raises(ConfigError, match=match):
            load_plan({"plan": {"name": "x", "comparisons": comps, "interactions": [inter]}})
    other = [comps[0], {**comps[1], "metric": "val"}]
    with pytest.raises(ConfigError, match="different metrics"):
        load_plan({"plan": {"name": "x", "comparisons": other, "interactions": [INTERACTION_PLAN["interactions"][0]]}})


GATED_PLAN = {**INTERACTION_PLAN, "gate": "harm6",
              "comparisons": [{**INTERACTION_PLAN["comparisons"][0], "predicted": "worse"},
                              {**INTERACTION_PLAN["comparisons"][1], "predicted": "equivalent",
                               "decisions": {"equivalent": "no harm at 1 pass"}}]}


def test_a_gate_is_tested_alone_and_the_others_are_interpreted_only_if_it_passes():
    harm1 = {1: 0.0, 2: 0.004, 3: 0.001, 4: -0.002}
    runs, evals = _passes_study({1: 0.015, 2: 0.02, 3: 0.01, 4: 0.016}, harm1)
    ungated = evaluate_plan(INTERACTION_PLAN, runs, evals)
    ev = evaluate_plan(GATED_PLAN, runs, evals)
    gate, h1, grows = ev["results"]
    # The gate keeps its own p; the Holm family shrinks to the other two tests.
    assert gate["gate"] and gate["test"]["p_used"] == gate["test"]["p"] < ungated["results"][0]["test"]["p_used"]
    assert ev["family_size"] == 2 and ev["gate"] == {"name": "harm6", "predicted": "worse", "outcome": "worse",
                                                     "passed": True}
    assert h1["test"]["p_used"] <= ungated["results"][1]["test"]["p_used"]
    assert "gated" not in h1 and h1["prediction"] in ("hit", "miss", "unresolved")
    # No harm at 6 passes: the gate fails, and a test that would be a hit is description only.
    failed = evaluate_plan(GATED_PLAN, *_passes_study({s: v + 0.0005 * s for s, v in harm1.items()}, harm1))
    gate, h1, grows = failed["results"]
    assert failed["gate"]["passed"] is False and gate["outcome"] != "worse"
    assert h1["outcome"] == "equivalent" and h1["prediction"] == "unresolved"
    assert h1["decision"].startswith("not interpreted: the gate harm6 came out") and grows["gated"]
    from plelab.experiments.plan_report import plan_blocks
    text = " ".join(str(b) for b in plan_blocks({"status": "registered", "record": {}, "evaluation": failed}))
    assert "harm6 (gate)" in text and "not passed, so the other tests are description only" in text
    assert "correction over the plan's 2 other tests" in text
    # Significantly worse but inside the margin is not the predicted "worse": the gate does not open.
    small = evaluate_plan({**GATED_PLAN, "margin": 0.05}, runs, evals)
    assert small["results"][0]["outcome"] == "worse, within margin" and small["gate"]["passed"] is False
    assert small["results"][1]["prediction"] == "unresolved"


def test_a_gate_is_sized_alone_and_the_family_at_holms_strictest_step():
    from plelab.experiments.plan import plan_power
    runs, evals = _passes_study({1: 0.015, 2: 0.02, 3: 0.01, 4: 0.016}, {1: 0.0, 2: 0.004, 3: 0.001, 4: -0.002})
    plan = {**GATED_PLAN, "effect_of_interest": 0.01}
    power = plan_power(plan, runs, evals, 5)
    gate, h1, grows = power["comparisons"]
    assert power["strict_level"] == pytest.approx(0.05 / 2)
    assert gate["gate"] and gate["strict"] is None
    assert h1["strict"]["alpha"] == pytest.approx(0.025)
    assert h1["strict"]["seeds_for_effect"] >= h1["power"]["seeds_for_effect"]
    ungated = plan_power({**INTERACTION_PLAN, "effect_of_interest": 0.01}, runs, evals, 5)
    assert ungated["strict_level"] == pytest.approx(0.05 / 3)


def test_bad_gates_are_refused_with_one_line():
    comps = GATED_PLAN["comparisons"]
    for gate, match in (("nope", "not a registered comparison"), ("harm1", "must predict a difference")):
        with pytest.raises(ConfigError, match=match):
            load_plan({"plan": {"name": "x", "comparisons": comps, "gate": gate}})
    with pytest.raises(ConfigError, match="other tests"):
        load_plan({"plan": {"name": "x", "comparisons": comps[:1], "gate": "harm6"}})


# The sha256 each committed plan was registered (or would be registered) under. A field added to the plan later
# must not change these: a sweep resumed with newer code would otherwise refuse its own registered plan.
REGISTERED_PLAN_HASHES = {
    "deadzone-tokens": "132455fb3050b45d3c4c444e2b0eae2eba11434615357a53f355967dae02b3b3",  # registered 2026-12-02
    "deadzone-law": "f91da1adc79e00036cb5e1d1afb6a321ea5cb91fe05d46731855926834f46a38",
    "ffn-study": "2a8ff63a6ce08b4050d6cc24d9ada460a09659e19711a501a7033eaa39861285",
    "visual-ple-study": "1061c28ff9143f4de6751c4cef828bdb4d569acf9b4f43a48915a239a46f3a4f",
    "visual-ple-ids": "423931180c6e84cc60e6e5d4529732185655b0ad865b9a4e9408aeac60c8ebb5",  # registered 2026-12-02
    "ffn-study-2": "65fea01123311bd70cf83e1ffbf1300199a98ea4378adf540f1a1e7dc278c9bb",  # registered 2026-12-02
    "deadzone-onset-h64": "0a4d6918053e6ae84eef8fd29719e90e9a52e24900a464ec79804c33a284d968",  # registered 2026-12-04
    "deadzone-onset-h32": "84950e119aa9a15f644f09dc17c853af8cd88f4dbe3e5caa989517d78ff3b611",  # registered 2026-12-04
    "ngram-study": "4607b821fab182e5c458c940558a5653a3eca39cf31ed1078f21df015e943b64",  # registered 2026-12-04
}


@pytest.mark.parametrize("name", sorted(REGISTERED_PLAN_HASHES))
def test_committed_plans_keep_their_registered_hash(name):
    assert plan_hash(load_plan(study_file(f"{name}.plan.toml"))) == REGISTERED_PLAN_HASHES[name]


def _small_gain_study() -> tuple[list[dict], dict]:
    """Three seeds whose dP = 8 run beats dP = 0 by 0.010-0.012 nats: a real gain, inside a 0.05 margin."""
    runs, evals = [], {}
    for seed, gain in ((1, 0.010), (2, 0.011), (3, 0.012)):
        for dim in (0, 8):
            name = f"s{seed}d{dim}"
            runs.append({"name": name, "status": "done", "seed": seed, "point": {"model.ple.dim": dim, "seed": seed}})
            evals[name] = {"val": {"loss": 5.0 + seed - (gain if dim else 0.0)}}
    return runs, evals


def _gain_plan(**test) -> dict:
    return {"name": "g", "margin": 0.05, "comparisons": [{
        "name": "dp8", "where": {"model.ple.dim": 8}, "reference_where": {"model.ple.dim": 0}, "metric": "val",
        "decisions": {"equivalent": "the gain is gone", "better": "it still pays"}, **test}]}


def test_better_within_margin_is_its_own_outcome_never_silently_an_equivalence():
    runs, evals = _small_gain_study()
    r = evaluate_plan(_gain_plan(predicted="equivalent"), runs, evals)["results"][0]
    assert r["outcome"] == "better, within margin"
    # The old scoring counted this as a hit for "equivalent" and gave it the "equivalent" decision ("gone").
    assert r["prediction"] == "miss" and r["hits"] == ["equivalent"] and r["hits_stated"] is False
    assert r["decision"] is None
    # The same outcome meets a "better" prediction: a real gain, however small.
    assert evaluate_plan(_gain_plan(predicted="better"), runs, evals)["results"][0]["prediction"] == "hit"
    # A plan that means "no gain larger than the margin" says so, and is scored so.
    stated = evaluate_plan(_gain_plan(predicted="equivalent", hits=["equivalent", "better, within margin"]),
                           runs, evals)["results"][0]
    assert stated["prediction"] == "hit" and stated["hits_stated"] is True
    # A plan that counts only an unqualified difference misses on a small one.
    strict = evaluate_plan(_gain_plan(predicted="better", hits=["better"]), runs, evals)["results"][0]
    assert strict["prediction"] == "miss"


def test_hits_must_fit_the_prediction_and_leave_old_plan_hashes_alone():
    for test, match in (({"hits": ["better"]}, "needs a prediction"),
                        ({"predicted": "better", "hits": ["equivalent"]}, "drawn, once each"),
                        ({"predicted": "equivalent", "hits": ["equivalent", "equivalent"]}, "once each"),
                        ({"predicted": "worse", "hits": ["not resolved"]}, "drawn")):
        with pytest.raises(ConfigError, match=match):
            load_plan({"plan": _gain_plan(**test)})
    plain = load_plan({"plan": _gain_plan(predicted="better")})
    stated = load_plan({"plan": _gain_plan(predicted="better", hits=["better", "better, within margin"])})
    # Stated hits are part of the registered plan; unstated ones are not hashed, so the plans registered before
    # the field existed keep their hashes (REGISTERED_PLAN_HASHES above checks the committed ones).
    assert plan_hash(plain) != plan_hash(stated)


@pytest.mark.parametrize(("test", "message"), [
    ('[[plan.comparisons]]\nname = "a"\nvariant = "swiglu_narow"\nreference_where = { "model.ple.dim" = 0 }\n'
     'metric = "val"\n', "no run of this sweep is its arm (variant 'swiglu_narow'; the sweep's variants: none"),
    ('[[plan.comparisons]]\nname = "a"\nwhere = { "model.ple.dim" = 8 }\nreference_where = { "model.ple.dim" = 4 }\n'
     'metric = "val"\n', "no run of this sweep is its reference (where {'model.ple.dim': 4}"),
    ('[[plan.dose_responses]]\nname = "d"\ndose = "model.hidden_size"\nmetric = "val"\n',
     "0 value(s) of the dose model.hidden_size"),
])
def test_a_plan_selecting_no_run_of_the_sweep_is_refused_before_registration(tmp_path, capsys, test, message):
    (tmp_path / "plan.toml").write_text(f'[plan]\nname = "t"\n{test}')
    sweep = load_sweep(_sweep_file(tmp_path))
    with pytest.raises(PlelabError, match=re.escape(message)):
        prepare(sweep)
    assert not sweep.db_path.exists()  # nothing registered, nothing to train
    assert main(["sweep", str(tmp_path / "sweep.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ("fix the plan before it is registered" in err[0] or "dose-response" in err[0])
