with

source as (

    select * from {{ source('shop', 'shop_events') }}
    where event_type = 'order_placed'

),

renamed as (

    select
        -- One order per accepted order_placed event (CONTRACT §3: a re-used
        -- order_id is its own order), so the event id is the order's key.
        event_id as order_key,
        order_id,
        customer_id,
        currency,
        total as order_total,
        aggregate(items, 0, (n, item) -> n + item.quantity) as item_count,
        event_time as placed_at

    from source

)

select * from renamed
