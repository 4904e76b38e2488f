"""Training: the recipe, the loop, resuming, the run folder, the schedule, data parallel.

:func:`train` trains the model a :class:`~qkv.train.recipe.Recipe` describes (DESIGN.md:
``qkv.train.train(config)``); :class:`TrainResult` is where it ended.
"""

from qkv.train.loop import TrainResult, train

__all__ = ["TrainResult", "train"]
