"""The seed's three Flux workflows on a device that holds half a transformer: they run, streamed."""

import attrs
import pytest
import torch

from blocks.flux import seed_scenario
from modular import ComponentsManager
from modular.batch.jobs import JobRunner
from offload import SimulatedDevice, module_nbytes


def _quick(demo):
    return [attrs.evolve(job, inputs={**job.inputs, "num_inference_steps": 2}) for job in demo.jobs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    demo = seed_scenario(tmp_path_factory.mktemp("scenario"))
    plain = list(JobRunner(ComponentsManager(), progress=False).run(_quick(demo)))
    half = module_nbytes(plain[0].pipeline.transformer) // 2
    cm = ComponentsManager()
    cm.enable_auto_cpu_offload(device=SimulatedDevice(half), memory_reserve_margin=0)
    tables = []
    results = []
    for result in JobRunner(cm, progress=False).run(_quick(demo)):
        results.append(result)
        tables.append(cm.table())
    return plain, results, cm, tables


def test_images_equal_the_runs_without_offload(runs):
    plain, results, _, _ = runs
    for with_offload, without in zip(results, plain, strict=True):
        assert torch.equal(torch.from_numpy(with_offload.images), torch.from_numpy(without.images))


def test_each_transformer_runs_partly_resident_and_the_table_and_info_say_so(runs):
    """The log streams each transformer; after each workflow its row reads "partial NN%"."""
    _, results, cm, tables = runs
    log = cm.offload_log
    for result, table in zip(results, tables):
        transformer_id = cm.get_id(result.pipeline.transformer)
        placed = [d for d in log if d.model_id == transformer_id and d.reason == "stream"]
        tails = [d for d in log if d.model_id == transformer_id and d.reason == "stream tail"]
        assert placed and tails
        row = next(line for line in table.splitlines() if line.startswith(transformer_id))
        assert "partial " in row and "%(sim)" in row
    share = cm.get_model_info(transformer_id, "resident_share")["resident_share"]
    assert 0 < share < 0.5
    assert log.total_bytes_to_host == 0
