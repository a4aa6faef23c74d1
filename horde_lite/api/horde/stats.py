"""/stats/text/*: finished jobs and tokens by period and by model."""

from __future__ import annotations

from litestar import get

from horde_lite.api.deps import HordeDep
from horde_lite.api.horde.schemas import SinglePeriodTxtStat, StatsTxtTotals, TxtModelStats
from horde_lite.operators import stats


@get("/stats/text/totals")
async def text_totals(horde: HordeDep) -> StatsTxtTotals:
    found = {
        k: SinglePeriodTxtStat(requests=v.requests, tokens=v.tokens)
        for k, v in (await stats.text_totals(horde)).items()
    }
    return StatsTxtTotals(
        minute=found["minute"],
        hour=found["hour"],
        day=found["day"],
        month=found["month"],
        total=found["total"],
    )


@get("/stats/text/models")
async def text_models(horde: HordeDep) -> TxtModelStats:
    found = await stats.text_model_totals(horde)
    return TxtModelStats(day=found["day"], month=found["month"], total=found["total"])


HANDLERS = [text_totals, text_models]
