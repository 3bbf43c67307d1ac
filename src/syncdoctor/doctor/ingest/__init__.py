"""Raw-log ingestion for the doctor: whatever logs users have (plain training
logs, torchrun/msrun/mpirun/srun output, NCCL_DEBUG, HCCL/CANN, Python
tracebacks) into per-rank loss series and communication/process events.

    from syncdoctor.doctor.ingest import ingest_logs
    data = ingest_logs(["runs/job42/"])
    data.losses      # polars: rank, step, loss, epoch, lr, grad_norm, source, line, acc
    data.events      # [syncdoctor.doctor.model.Event], file order; Event.t for time order
    data.formats     # {source: format name}
    data.warnings    # input problems, one line each
"""

from syncdoctor.doctor.ingest.core import LOSS_SCHEMA, LogData, ingest_logs
from syncdoctor.doctor.ingest.events import EVENT_KINDS

__all__ = ["EVENT_KINDS", "LOSS_SCHEMA", "LogData", "ingest_logs"]
