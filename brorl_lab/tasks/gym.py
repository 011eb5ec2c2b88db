"""(family module: registers its families with brorl_lab.tasks.register_task)"""
