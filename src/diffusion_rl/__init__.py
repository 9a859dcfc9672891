"""diffusion_rl: reinforcement-learning post-training for diffusion language models.

The library knows nothing of Hydra; ``src/train.py`` and ``src/eval.py`` compose configs and call
:func:`diffusion_rl.train.train` / :func:`diffusion_rl.evaluate.evaluate`.
"""

__version__ = "0.1.0"
