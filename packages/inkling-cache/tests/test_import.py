def test_placeholder(): import inkling_cache
