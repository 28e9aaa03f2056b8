"""lpgemm harness: everything that measures the kernels, apart from the kernels themselves.

Deterministic inputs (``inputs``), compilation and its checks (``compile``), GPU timing (``bench``), one
measurement point (``runner``), error metrics (``metrics``), the GPU and its tags (``device``), library
ceilings (``ceilings``), code dependencies of a job (``deps``), a job's life (``jobs``: its log, its
lock, no job outliving its snakemake), files written whole or not at all (``atomic``), tidy tables
(``tables``), figures (``figures``) and the HTML report (``report``). Plain Python, no Snakemake: the
workflow's scripts are thin callers (``jobs`` reads the ``snakemake`` object it is handed, and needs no
Snakemake to import), and tests and users import it the same way. ``kernels`` (the kernels, their formats
and the registry) never imports it.
"""
