"""The code-generation passes, one module each, named as the pass and defining one function of
that name, ``KernelPlan -> KernelPlan`` (glcomp.codegen.pipeline.PIPELINE lists them in order).
Each module's docstring states what its pass guarantees. Nothing is imported here: importing a
pass module imports only what that pass needs."""
