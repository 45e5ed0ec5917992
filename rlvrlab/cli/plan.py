"""`rlvrlab plan`: rlvrlab.report.plan.command, with PlanRequest's fields as its options (docs/sweeps.md)."""
from rlvrlab.cli.options import with_request_options
from rlvrlab.report import plan as library

plan = with_request_options(library.command, library.PlanRequest, after=1)
