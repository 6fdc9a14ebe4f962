"""Online reinforcement learning on top of ``ReplayBufferDataModule``.

Not imported by ``import rb_lightning``: environments come from gymnasium
(``pip install "rb-lightning[rl]"``), imported only when one is built.
"""

from rb_lightning.rl.collector import OnlineCollector
from rb_lightning.rl.dqn import DQN
from rb_lightning.rl.evaluation import EvaluatesEpisodes, Evaluation
from rb_lightning.rl.goal import StopAtGoal
from rb_lightning.rl.sac import SAC
from rb_lightning.rl.threads import TorchThreads

__all__ = ["DQN", "SAC", "EvaluatesEpisodes", "Evaluation", "OnlineCollector", "StopAtGoal", "TorchThreads"]
