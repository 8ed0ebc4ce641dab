/* answer.h — the one answer both front ends of the A/B serve: proxy_bench.py's upstream body. */
#ifndef SLUICE_BENCH_AB_ANSWER_H
#define SLUICE_BENCH_AB_ANSWER_H

#define AB_ANSWER                                                                                \
    "{\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion\",\"created\":0,\"model\":"       \
    "\"bench\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"     \
    "\"hi\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,"                     \
    "\"completion_tokens\":1,\"total_tokens\":6}}"

#endif
