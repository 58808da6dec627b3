"""Running the app on a machine: what the machine has and the backend and engine settings that
suit it (:mod:`~backend.deploy.hardware`), and the process's lifecycle, its temp folders and a
clean shutdown on SIGTERM / SIGINT (:mod:`~backend.deploy.lifecycle`). Only the app and the UI
import it. The machinery lower layers need at run time (the build cache, worker processes,
ZeroGPU leases) is not here but in :mod:`backend.runtime`, so that the generators and the checks
never import deployment.
"""
