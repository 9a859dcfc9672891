"""diffusion_rl: reinforcement-learning post-training for diffusion language models.

The library knows nothing of Hydra; ``src/train.py`` and ``src/eval.py`` compose configs and call
:func:`diffusion_rl.app.train.train` / :func:`diffusion_rl.app.evaluate.evaluate`.
"""

__version__ = "0.1.0"
