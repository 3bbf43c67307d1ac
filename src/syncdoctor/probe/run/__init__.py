"""`syncdoctor run`'s machinery, framework-free: the sitecustomize boot every process of
a run imports (`boot`: the log tee, the rank's run folder, the attach when torch or
MindSpore is imported) and the launcher that prepares the environment and runs the
user's command (`launcher`). The command line itself lives in syncdoctor/cli."""
