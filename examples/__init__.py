"""The examples, installed with the package as ``tokenpools.examples``: the example configurations (YAML; the
paper's experiments are what ``tokenpools demo`` replays) and ``effective_limits``, a standalone subscriber of the
effective-limits topic that needs only aiokafka (``python -m tokenpools.examples.effective_limits``). It builds
its own Kafka consumer on purpose: it shows third parties how to read the topic without tokenpools."""
