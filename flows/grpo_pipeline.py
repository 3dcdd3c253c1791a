"""The pipeline as one Prefect flow. It reads top to bottom like the DAG it runs:

    prepare_data -> validate_data -> prepare_suite(s) -> decontaminate -> pin_model -> base_model -> check_inputs
        -> sft_warmup -> evaluate(sft, every suite)
        -> [grpo_round(r), r = 1..R: (difficulty_filter(r)) -> grpo_train(r) -> evaluate(r, every suite) -> register(r)]

Each stage is a Prefect task over a plain function in tasks/ (usable without Prefect), declared with its caching and
retries in flows/stages.py; what the rounds train and are scored on is prepared in flows/inputs.py, and the rounds
(or a staged recipe's stages) run and are registered in flows/rounds.py. Tasks exchange paths plus content
fingerprints, never models or DataFrames. A stage's cache key is the one key that also names its output directory
(tasks/core/stage.py): its config section, its inputs' fingerprints, the project code it runs and the user's code it
calls. Rerunning an unchanged config hits the cache everywhere; changing only `grpo.*` reruns GRPO and what follows
it.
"""

from __future__ import annotations

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from grpo_pipeline.configs.schema import HELDOUT, ConfigError, PipelineConfig, load_config
from grpo_pipeline.flows.inputs import prepare_inputs, sft_bar
from grpo_pipeline.flows.rounds import Release, Scores, evaluate_suites, staged_rounds
from grpo_pipeline.flows.stages import Stages, base_model, check_inputs, check_sft, pin_model, sft_warmup
from grpo_pipeline.flows.summary import Summary
from grpo_pipeline.flows.summary_tables import as_markdown, headline, score_table
from grpo_pipeline.tasks.core.runtime import setup
from grpo_pipeline.tasks.core.stage import RunContext
from grpo_pipeline.tasks.preflight import check_config
from grpo_pipeline.tasks.scoring.curves import MATRIX_ARTIFACT, ROUNDS_ARTIFACT, matrix_figure, rounds_figure
from grpo_pipeline.tasks.training.trainer import check_model_runtime
from grpo_pipeline.tasks.training.vllm_rollouts import check_vllm_runtime


def resolve_config(config: PipelineConfig | None, recipe: str | None, overrides: list[str] | None) -> PipelineConfig:
    if config is not None and (recipe or overrides):
        raise ConfigError("give the flow either `config` or `recipe`/`overrides`, not both")
    return config if config is not None else load_config(recipe, overrides or [])


@flow(name="grpo-pipeline", log_prints=False)
def grpo_pipeline(
    config: PipelineConfig | None = None,
    recipe: str | None = None,
    overrides: list[str] | None = None,
) -> Summary:
    """Data -> validation -> SFT warmup -> R rounds of GRPO, each evaluated and registered in MLflow.

    Give either the whole `config`, or a `recipe` (a YAML path, relative to the working directory) with
    `overrides` (`key.sub=value` strings, as on the command line); neither means the defaults.
    """
    cfg = resolve_config(config, recipe, overrides)
    return report(cfg, run_stages(cfg, Stages()))


def run_stages(cfg: PipelineConfig, run: Stages) -> Summary:
    """The flow's body: every stage through `run`, the flow's Prefect tasks (benchmarks/overhead.py runs the same
    body with a `run` that calls the stage functions themselves, to measure what Prefect adds)."""
    setup(cfg)
    check_config(cfg)  # run dir, rewards, base model path: fail before any stage runs
    check_model_runtime(cfg.model)  # 4-bit weights need CUDA
    check_vllm_runtime(cfg.grpo)  # so do vLLM rollouts
    ctx = RunContext.of(cfg)

    data, suites, clean = prepare_inputs(run, cfg)
    model_cfg = run("pin_model", pin_model, listed=False, cfg=cfg.model, run_dir=cfg.run_dir)
    base = run("base_model", base_model, cfg=model_cfg, run_dir=cfg.run_dir, seed=cfg.seed)
    # Before anything trains: rewards score real rows, prompts fit the context, one GRPO batch of rows exists.
    run(
        "check_inputs", check_inputs, listed=False,
        data=data, base=base, grpo=cfg.grpo, eval_cfg=cfg.eval, sft_enabled=cfg.sft.enabled,
    )  # fmt: skip
    policy, label = base, "base"
    scores_of: dict[str, Scores] = {}
    if cfg.eval.score_base and cfg.sft.enabled:
        scores_of["base"] = evaluate_suites(run, cfg, base, suites, "base")
    if cfg.sft.enabled:
        policy = run(
            "sft_warmup", sft_warmup,
            base=base, train=data.sft_train, cfg=cfg.sft, model_cfg=model_cfg, ctx=ctx, **sft_bar(cfg, data),
        )  # fmt: skip
        label = "sft"
    scores_of[label] = evaluate_suites(run, cfg, policy, suites, label)
    baselines = scores_of[label]
    baseline = baselines[cfg.gating_suite()]
    learned = None  # before GRPO: has SFT learned its data? (a warning, or an error with monitors.sft_not_learned)
    if cfg.sft.enabled and cfg.monitors.sft_min_ratio:
        learned = run(
            "check_sft", check_sft, listed=False,
            train=data.train, sft=baselines.get(HELDOUT, baseline), correctness_reward=cfg.eval.correctness_reward,
            monitors=cfg.monitors,
        )  # fmt: skip
    warning = learned.warning if learned else None

    release = Release(run=run, recipe=cfg, cfg=cfg, suites=suites, model_cfg=model_cfg, base=base,
                      baselines=baselines, sft_warning=warning, clean=clean)  # fmt: skip
    rounds, stopped = staged_rounds(release, policy, baselines, data)
    return Summary.build(
        cfg, run.records, baseline, rounds,
        sft_warning=warning, scores_of=scores_of, suite_seconds=run.suite_seconds, clean=clean, stopped=stopped,
    )  # fmt: skip


def report(cfg: PipelineConfig, summary: Summary) -> Summary:
    """Publish the run summary as Prefect artifacts (and the rounds as a plot in MLflow); its headline goes to the
    log."""
    if summary.registrations and len(summary.rounds) > 1:
        log_rounds_plot(summary)
    markdown = as_markdown(summary)
    create_markdown_artifact(markdown=markdown, key="grpo-pipeline-summary", description="Run summary")
    create_table_artifact(
        table=score_table(summary), key="grpo-pipeline-scores", description=f"Scores on every eval suite ({cfg.name})"
    )
    logger = get_run_logger()  # the whole summary is the artifact (and the CLI prints it); the log gets one line
    logger.info("pipeline finished: %s (summary: artifact grpo-pipeline-summary)", headline(summary))
    logger.debug("run summary:\n%s", markdown)
    return summary


def log_rounds_plot(summary: Summary) -> None:
    """The rounds table as a plot, `plots/rounds.png` in the MLflow run of the last version registered: SFT, then
    each round's gating metric; a staged run's matrix as a heatmap beside it (`plots/stages.png`). A store that
    refuses them costs the plots only (said in the log), never the run."""
    import matplotlib.pyplot as plt
    from mlflow import MlflowClient

    rows, run_id = summary.rounds, summary.registrations[-1].run_id
    title = f"{summary.recipe}: {rows[0].metric} by stage"
    figures = {ROUNDS_ARTIFACT: rounds_figure({summary.recipe: [(row.model, row.value) for row in rows]},
                                              rows[0].metric, title=title)}  # fmt: skip
    if summary.matrix:
        matrix = [(row.stage or row.model, row.values) for row in summary.matrix]
        figures[MATRIX_ARTIFACT] = matrix_figure(matrix, rows[0].metric)  # the recipe's gating metric
    for artifact, fig in figures.items():
        try:
            MlflowClient().log_figure(run_id, fig, artifact)
        except Exception as err:  # the versions are registered; a missing plot must not fail the run
            get_run_logger().warning("%s was not logged to MLflow run %s: %s", artifact, run_id, err)
        finally:
            plt.close(fig)
