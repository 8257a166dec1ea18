"""Real services for development, tests and CI, started by the project's own code (never mocks).

One module per server — ``kafka`` (+ ``kafka_config``), ``inference_sim``, ``vllm`` (+ ``vllm_model``, which vLLM's
own python runs), ``prometheus``, ``kube`` (etcd + kube-apiserver; ``kube_objects`` talks to it), ``service`` (a
pool's Service) — over the primitives of ``process``; ``stack`` runs them all with the control plane (``tokenpools
up``/``down``, ``cli``).
"""
