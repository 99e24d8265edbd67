"""The driver side of training (the command's process): everything before, around and after the ``TorchTrainer``.

The entry point is :func:`raycpt.train.driver.launch.run_training`; nothing here runs inside a Ray Train worker.
"""
