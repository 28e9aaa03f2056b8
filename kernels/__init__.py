"""lpgemm kernels: TileLang low-precision GEMMs, their quantizers, CPU emulations and references.

Plain Python, no workflow code: the Snakemake rules under ``workflow/`` call into this package.
"""
