"""A stand-in for ``vllm run-batch`` that plays its file contract, for the tests of
`optimizer.judge.providers.run_batch` (run as a script: ``python fake_run_batch.py -i IN -o OUT --model M``).

It reads the OpenAI batch input file (one ``{"custom_id", "method", "url", "body"}`` object a line) and
writes, in input order and line by line as vLLM streams it, one ``{"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}`` object a line: ``body`` a chat completion whose answer
is the verdict ``--answers`` (a JSON object: instruction -> verdict text) gives the item whose
instruction the request names, with ``--usage`` tokens; or, with ``--fake-judge WS`` instead, what the
loop tests' deterministic judge (`tests.support.loop.FakeJudge` over workspace WS) answers. Test-only
knobs break chosen lines (1-based, in input order): ``--garble N`` writes text that is not JSON,
``--drop N`` writes nothing, ``--error N`` writes vLLM's error line (status 400, the message as a plain
string). Only ``--fake-judge`` imports from the project (run it with the checkout on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from collections.abc import Callable
from typing import Any


def by_instruction(path: str) -> Callable[[dict[str, Any]], str]:
    with open(path, encoding="utf-8") as f:
        answers: dict[str, str] = json.load(f)

    def answer(body: dict[str, Any]) -> str:
        text = json.dumps(body)
        [verdict] = [v for instruction, v in answers.items() if instruction in text]
        return verdict

    return answer


def fake_judge(root: str, good_fixes_neg: float | None) -> Callable[[dict[str, Any]], str]:
    from pathlib import Path

    from tests.support.fakeserver import RecordedRequest
    from tests.support.loop import FakeJudge

    judge = (
        FakeJudge(Path(root))
        if good_fixes_neg is None
        else FakeJudge(Path(root), good_fixes_neg=good_fixes_neg)
    )

    def answer(body: dict[str, Any]) -> str:
        recorded = RecordedRequest("POST", "/v1/chat/completions", "openai", {}, False, body)
        return str(judge(recorded).text)

    return answer


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("-i", "--input-file", required=True)
    parser.add_argument("-o", "--output-file", required=True)
    parser.add_argument("--model", required=True)
    answering = parser.add_mutually_exclusive_group(required=True)
    answering.add_argument("--answers")
    answering.add_argument("--fake-judge")
    parser.add_argument("--good-fixes-neg", type=float, help="--fake-judge: FakeJudge's good_fixes_neg")
    parser.add_argument("--usage", default="1000,50", help="prompt and completion tokens of every answer")
    parser.add_argument("--garble", type=int, action="append", default=[])
    parser.add_argument("--drop", type=int, action="append", default=[])
    parser.add_argument("--error", type=int, action="append", default=[])
    args = parser.parse_args(argv)
    answer = (
        fake_judge(args.fake_judge, args.good_fixes_neg) if args.fake_judge else by_instruction(args.answers)
    )
    prompt_tokens, completion_tokens = (int(n) for n in args.usage.split(","))
    with (
        open(args.input_file, encoding="utf-8") as source,
        open(args.output_file, "w", encoding="utf-8") as out,
    ):
        for number, raw in enumerate((line for line in source if line.strip()), start=1):
            request = json.loads(raw)
            body = request["body"]
            if body.get("model") != args.model:  # vLLM answers only the model it serves
                raise SystemExit(f"line {number}: model {body.get('model')!r} is not {args.model!r}")
            if number in args.drop:
                continue
            if number in args.garble:
                out.write('{"id": "vllm-broken", "custom_id": \n')
                continue
            line: dict[str, object] = {"id": f"vllm-{uuid.uuid4().hex}", "custom_id": request["custom_id"]}
            if number in args.error:
                line["response"] = {
                    "status_code": 400,
                    "request_id": f"vllm-batch-{uuid.uuid4().hex}",
                    "body": None,
                }
                line["error"] = "The model could not answer this request"
            else:
                verdict = answer(body)
                line["response"] = {
                    "status_code": 200,
                    "request_id": f"vllm-batch-{uuid.uuid4().hex}",
                    "body": {
                        "id": f"chatcmpl-{uuid.uuid4().hex}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": args.model,
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": verdict},
                                "finish_reason": "stop",
                                "logprobs": None,
                            }
                        ],
                        "usage": {
                            "prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens,
                            "total_tokens": prompt_tokens + completion_tokens,
                        },
                    },
                }
                line["error"] = None
            out.write(json.dumps(line) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
