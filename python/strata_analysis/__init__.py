"""Reading and analysing Strata results files (HDF5, results/SCHEMA.md): `results` is the reader; `report`,
`compare`, `merge` and `trace` are the commands strata-report, strata-compare, strata-merge and strata-trace."""

__version__ = "0.1.0"
