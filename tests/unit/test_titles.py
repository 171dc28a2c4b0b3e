from slotkeeper.core.sessions.titles import title_and_preview

REAL = ("<s><|im_start|> system\nBe brief.<|im_end|> \n<|im_start|> user\nHello there how are you "
        "today<|im_end|> \n<|im_start|> assistant\nfine<|im_end|> \n<|im_start|> user\ngood<|im_end|> "
        "\n<|im_start|> assistant\n ea oth")


def test_chatml_as_detokenized_by_the_real_server():
    title, preview = title_and_preview(REAL)
    assert title == "Hello there how are you today"
    assert preview == "You: good / Assistant: ea oth"


def test_other_templates_and_fallback():
    llama3 = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nPlan a trip<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nSure.<|eot_id|>")
    assert title_and_preview(llama3)[0] == "Plan a trip"
    gemma = "<bos><start_of_turn>user\nWhy is the sky blue?<end_of_turn>\n<start_of_turn>model\nLight."
    assert title_and_preview(gemma) == ("Why is the sky blue?", "You: Why is the sky blue? / Model: Light.")
    mistral = "<s>[INST] Tell me a joke [/INST] No.</s>"
    assert title_and_preview(mistral)[0] == "Tell me a joke"
    assert title_and_preview("just some text " * 20)[0].endswith("…")
    assert title_and_preview("")[0] == "(empty conversation)"
