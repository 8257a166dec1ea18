"""Write one JSON Schema file per record type into topics/schemas/ (``python -m tokenpools.topics.export``).

A unit test fails when the committed files differ from what the models produce, so they cannot drift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tokenpools.topics.batches import BATCH_TYPE, EventBatch
from tokenpools.topics.records import RECORD_TYPES, SCHEMA_VERSION


def schema_files() -> dict[str, str]:
    """Every record type's schema, and the event_batch envelope that carries events of one topic and key."""
    files = {}
    for record_type, cls in sorted({**RECORD_TYPES, BATCH_TYPE: EventBatch}.items()):
        schema = cls.model_json_schema(mode="serialization")
        schema["$id"] = f"https://tokenpools.io/schemas/{record_type}.v{SCHEMA_VERSION}.json"
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        files[f"{record_type}.v{SCHEMA_VERSION}.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return files


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0] if argv else Path(__file__).parent / "schemas")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in schema_files().items():
        (out / name).write_text(text)
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
